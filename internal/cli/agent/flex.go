package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/berth-io/berth/api/v1alpha1"

	"github.com/berth-io/berth/internal/agent/socket"
	"github.com/berth-io/berth/internal/flexvolume"
	"github.com/berth-io/berth/internal/metrics"
)

// flexRunnable installs the Flexvolume driver, then opens the agent socket
// and runs the driver's init the way kubelet will: the socket serves mounts
// only after that handshake went through, and the agent is ready then. A
// failed install or init degrades only the Flexvolume path: it is logged,
// told in an Event and a condition on the Node (FlexvolumeCondition) and in
// berth_flexvolume_driver_ready, and retried; the agent (and its CSI node
// service, which alone makes the agent ready) keeps running. Without a
// plugin folder it installs nothing, removes the condition, and still
// serves the socket to a driver installed before.
type flexRunnable struct {
	server *socket.Server
	socket string
	// pluginDir is kubelet's Flexvolume folder, a path on the node.
	pluginDir string
	// root finds the node's root folder, below which pluginDir is reached
	// (flexvolume.HostRoot; nil: pluginDir as this process sees it).
	root func() (string, error)
	// dir is pluginDir below the node's root, once the install found it.
	dir string
	// binary is installed as the driver ("": this executable).
	binary string
	log    logr.Logger
	// events gets a Warning on the node for a failed install (nil: none).
	events record.EventRecorder
	node   string
	// condition writes FlexvolumeCondition on the node (nil: nothing);
	// nil removes it.
	condition func(ctx context.Context, c *corev1.NodeCondition) error
	// retry is the first wait after a failure, doubled up to maxRetry
	// (defaults 5s and 5m).
	retry, maxRetry time.Duration
	metrics         *metrics.FlexDriver
	// removable, when set, says as the agent stops whether the driver it
	// installed may go: ("", true) removes it, else why it stays.
	removable func(ctx context.Context) (why string, ok bool)

	ready   atomic.Bool
	problem atomic.Pointer[string]
}

func (f *flexRunnable) Start(ctx context.Context) error {
	f.metrics.Set(false)
	var driver string
	if f.pluginDir == "" {
		f.report(ctx, nil)
	} else {
		f.server.RequireHandshake = true
		ok := f.untilDone(ctx, "install", reasonFlexInstallFailed, func() (err error) {
			driver, err = f.install()
			return err
		})
		if !ok {
			return nil
		}
		defer f.removeIfUnused()
	}
	l, err := socket.Listen(f.socket)
	if err != nil {
		return err
	}
	defer func() { _ = os.Remove(f.socket) }()
	served := make(chan error, 1)
	go func() { served <- f.server.Serve(ctx, l) }()

	if driver != "" {
		if !f.untilDone(ctx, "init", reasonFlexInitFailed, func() error { return f.init(ctx, driver) }) {
			return <-served
		}
		f.report(ctx, &corev1.NodeCondition{Status: corev1.ConditionTrue, Reason: reasonFlexInstalled,
			Message: "driver " + filepath.Join(f.pluginDir, flexvolume.Dir, flexvolume.Name) + " installed; its init reached the agent"})
	}
	f.problem.Store(nil)
	f.ready.Store(true)
	f.metrics.Set(true)
	return <-served
}

// removeIfUnused removes the installed driver when removable allows it:
// `helm uninstall` leaves nothing of berth on the node then.
func (f *flexRunnable) removeIfUnused() {
	if f.removable == nil {
		return
	}
	// The agent's own context has ended: a short one of its own.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if why, ok := f.removable(ctx); !ok {
		f.log.Info("flexvolume driver stays", "reason", why)
		return
	}
	if err := flexvolume.Remove(f.dir); err != nil {
		f.log.Error(err, "flexvolume driver could not be removed", "pluginDir", f.pluginDir)
		return
	}
	f.log.Info("flexvolume driver removed: no StorageCluster is left and no pod on the node has a berth Flexvolume mount",
		"pluginDir", f.pluginDir)
}

// flexRemovable allows the driver's removal when no StorageCluster is left
// (berth is being removed; a restarted agent installs the driver again)
// and no pod on the node has a berth Flexvolume mount, whose unmount
// kubelet runs through the driver. In doubt (the API server not
// answering) the driver stays.
func flexRemovable(api client.Reader, kubeletDir string) func(ctx context.Context) (string, bool) {
	return func(ctx context.Context) (string, bool) {
		var l v1.StorageClusterList
		if err := api.List(ctx, &l, client.Limit(1)); err != nil {
			return fmt.Sprintf("cannot tell whether a StorageCluster is left: %v", err), false
		}
		if len(l.Items) > 0 {
			return "StorageCluster " + l.Items[0].Name + " is left", false
		}
		if kubeletDir == "" {
			return "no kubelet dir to look for Flexvolume mounts in", false
		}
		m, err := flexvolume.MountsIn(kubeletDir)
		if err != nil {
			return err.Error(), false
		}
		if len(m) > 0 {
			return fmt.Sprintf("%d berth Flexvolume mount(s) on the node, such as %s", len(m), m[0]), false
		}
		return "", true
	}
}

// report writes the node's FlexvolumeCondition (nil: removes it). A write
// that fails is logged only: the Event and the metric still tell.
func (f *flexRunnable) report(ctx context.Context, c *corev1.NodeCondition) {
	if f.condition == nil {
		return
	}
	if err := f.condition(ctx, c); err != nil && ctx.Err() == nil {
		f.log.Error(err, "writing the node's condition", "type", FlexvolumeCondition)
	}
}

// untilDone runs step until it succeeds, reporting each failure (with
// reason in the node's condition) and waiting a growing time in between;
// false when ctx ended first.
func (f *flexRunnable) untilDone(ctx context.Context, what, reason string, step func() error) bool {
	wait, maxWait := f.retry, f.maxRetry
	if wait <= 0 {
		wait = 5 * time.Second
	}
	if maxWait <= 0 {
		maxWait = 5 * time.Minute
	}
	for {
		err := step()
		if err == nil {
			return true
		}
		msg := fmt.Sprintf("flexvolume driver %s failed (retry in %v; the CSI node service is not affected): %v", what, wait, err)
		f.problem.Store(&msg)
		f.log.Error(err, "flexvolume driver "+what+" failed; retrying", "retryIn", wait)
		if f.events != nil {
			ref := &corev1.ObjectReference{Kind: "Node", Name: f.node, UID: types.UID(f.node)}
			f.events.Event(ref, corev1.EventTypeWarning, "FlexvolumeDriverFailed", msg)
		}
		// Without the retry wait: an unchanged failure rewrites nothing.
		f.report(ctx, &corev1.NodeCondition{Status: corev1.ConditionFalse, Reason: reason,
			Message: fmt.Sprintf("flexvolume driver %s failed (the CSI node service is not affected): %v", what, err)})
		select {
		case <-ctx.Done():
			return false
		case <-time.After(wait):
		}
		wait = min(2*wait, maxWait)
	}
}

func (f *flexRunnable) install() (string, error) {
	self := f.binary
	if self == "" {
		var err error
		if self, err = os.Executable(); err != nil {
			return "", fmt.Errorf("find own binary: %w", err)
		}
		self = flexvolume.DriverBinary(self)
	}
	if f.dir == "" {
		root := "/"
		if f.root != nil {
			var err error
			if root, err = f.root(); err != nil {
				return "", fmt.Errorf("find the node's root: %w", err)
			}
		}
		dir, err := flexvolume.InRoot(root, f.pluginDir)
		if err != nil {
			return "", err
		}
		f.dir = dir
	}
	return flexvolume.Install(f.dir, self, map[string]string{flexvolume.SocketFile: f.socket + "\n"})
}

// init runs the installed driver's init, which handshakes with the socket.
func (f *flexRunnable) init(ctx context.Context, driver string) error {
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
	if res.Status != flexvolume.StatusSuccess || !strings.HasPrefix(res.Message, flexvolume.ReadyMessage) {
		return fmt.Errorf("installed driver %s init: %s: %s", driver, res.Status, res.Message)
	}
	f.log.Info("flexvolume driver installed", "path", driver, "init", res.Message)
	return nil
}

// State is nil once the driver is installed and its init went through,
// else what is missing or failed.
func (f *flexRunnable) State() error {
	if f.ready.Load() {
		return nil
	}
	if p := f.problem.Load(); p != nil {
		return errors.New(*p)
	}
	return errors.New("flexvolume driver not installed and verified yet")
}
