package agent

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/tools/record"

	"github.com/berth-io/berth/internal/agent/socket"
	"github.com/berth-io/berth/internal/flexvolume"
	"github.com/berth-io/berth/internal/testenv"
)

type noOps struct{}

func (noOps) Node() string                                             { return "n1" }
func (noOps) FlexMount(context.Context, flexvolume.MountRequest) error { return nil }
func (noOps) FlexUnmount(context.Context, string) error                { return nil }

// TestFlexInstallRetriedUntilInstalled: a driver folder that cannot be
// made fails the install, which is retried and told (its state, an Event
// on the node) while Start keeps running, and no socket is opened; once the
// folder can be made the driver is installed and the socket opens, serving
// mounts only after a handshake. (The installed driver is /bin/true, whose
// init prints no answer: the agent keeps retrying it, still not ready.)
func TestFlexInstallRetriedUntilInstalled(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("the agent socket admits only root peers; run as root")
	}
	dir := t.TempDir()
	blocker := filepath.Join(dir, "plugins")
	if err := os.WriteFile(blocker, nil, 0o600); err != nil { // a file where the folder must go
		t.Fatal(err)
	}
	events := record.NewFakeRecorder(100)
	f := &flexRunnable{
		server: socket.NewServer(noOps{}, testr.New(t)), socket: filepath.Join(dir, "agent.sock"),
		pluginDir: filepath.Join(blocker, "exec"), binary: "/bin/true", log: testr.New(t), events: events, node: "n1",
		retry: 20 * time.Millisecond, maxRetry: 50 * time.Millisecond,
	}
	ctx := testenv.Serve(t, "Start", f.Start)

	poll := func(what string, cond func() bool) {
		t.Helper()
		if err := wait.PollUntilContextTimeout(ctx, 10*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
			return cond(), nil
		}); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	poll("readiness naming the failed install", func() bool {
		err := f.State()
		return err != nil && strings.Contains(err.Error(), "install failed")
	})
	select {
	case e := <-events.Events:
		if !strings.Contains(e, "FlexvolumeDriverFailed") {
			t.Errorf("event %q", e)
		}
	default:
		t.Error("no Event for the failed install")
	}
	if _, err := os.Stat(f.socket); !os.IsNotExist(err) {
		t.Fatalf("socket before the driver is installed: %v", err)
	}

	if err := os.Remove(blocker); err != nil {
		t.Fatal(err)
	}
	poll("socket once the driver is installed", func() bool { _, err := os.Stat(f.socket); return err == nil })
	if _, err := os.Stat(filepath.Join(blocker, "exec", flexvolume.Dir, flexvolume.Name)); err != nil {
		t.Fatalf("installed driver: %v", err)
	}
	resp, err := socket.Call(ctx, f.socket, socket.Request{Op: socket.OpUnmount, MountDir: "/m"})
	if err != nil || resp.Code != socket.CodeNotReady {
		t.Fatalf("unmount before any handshake: %+v %v", resp, err)
	}
	poll("readiness naming the failed init", func() bool {
		err := f.State()
		return err != nil && strings.Contains(err.Error(), "init failed")
	})
}
