package agent

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"

	"github.com/berth-io/berth/internal/agent/socket"
	flexcli "github.com/berth-io/berth/internal/cli/flexvolume"
	"github.com/berth-io/berth/internal/flexvolume"
)

// flexRunnable serves the agent socket, then installs the Flexvolume driver
// and runs its init the way kubelet will; the agent is ready only after
// that handshake went through.
type flexRunnable struct {
	server    *socket.Server
	socket    string
	pluginDir string
	log       logr.Logger
	ready     atomic.Bool
}

func (f *flexRunnable) Start(ctx context.Context) error {
	l, err := socket.Listen(f.socket)
	if err != nil {
		return err
	}
	defer func() { _ = os.Remove(f.socket) }()
	served := make(chan error, 1)
	go func() { served <- f.server.Serve(ctx, l) }()

	if f.pluginDir != "" {
		if err := f.install(ctx); err != nil {
			return err
		}
	}
	f.ready.Store(true)
	return <-served
}

func (f *flexRunnable) install(ctx context.Context) error {
	self, err := os.Executable()
	if err != nil {
		return fmt.Errorf("find own binary: %w", err)
	}
	driver, err := flexvolume.Install(f.pluginDir, self, map[string]string{flexcli.SocketFile: f.socket + "\n"})
	if err != nil {
		return err
	}
	// The driver only answers from its own code: a minute is plenty.
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, driver, "init").Output()
	if err != nil {
		return fmt.Errorf("installed driver %s init: %w", driver, err)
	}
	var res flexvolume.Result
	if err := json.Unmarshal(out, &res); err != nil {
		return fmt.Errorf("installed driver %s init printed %q: %w", driver, out, err)
	}
	if res.Status != flexvolume.StatusSuccess || !strings.HasPrefix(res.Message, flexcli.ReadyMessage) {
		return fmt.Errorf("installed driver %s init: %s: %s", driver, res.Status, res.Message)
	}
	f.log.Info("flexvolume driver installed", "path", driver, "init", res.Message)
	return nil
}

// Ready is a readiness check for the manager.
func (f *flexRunnable) Ready(_ *http.Request) error {
	if !f.ready.Load() {
		return fmt.Errorf("flexvolume driver not installed and verified yet")
	}
	return nil
}
