package agent

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/tools/record"

	v1 "github.com/berth-io/berth/api/v1alpha1"
	"github.com/berth-io/berth/internal/agent/socket"
	"github.com/berth-io/berth/internal/flexvolume"
	"github.com/berth-io/berth/internal/testenv"
)

// wantFailedEvent wants a FlexvolumeDriverFailed Warning recorded.
func wantFailedEvent(t *testing.T, events *record.FakeRecorder) {
	t.Helper()
	select {
	case e := <-events.Events:
		if !strings.Contains(e, "Warning FlexvolumeDriverFailed") {
			t.Errorf("event %q", e)
		}
	default:
		t.Error("no Event for the failed install")
	}
}

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

	poll := func(what string, cond func() bool) { t.Helper(); pollFor(ctx, t, what, cond) }
	poll("readiness naming the failed install", func() bool {
		err := f.State()
		return err != nil && strings.Contains(err.Error(), "install failed")
	})
	wantFailedEvent(t, events)
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

// TestFlexInstallsBelowTheNodesRoot: the plugin folder is a path on the
// node, reached below the node's root (flexvolume.HostRoot), its links
// resolved there; a root that cannot be found fails the install, told like
// any failed install, and the runnable keeps running.
func TestFlexInstallsBelowTheNodesRoot(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("the agent socket admits only root peers; run as root")
	}
	dir := t.TempDir()
	node := filepath.Join(dir, "node")
	if err := os.MkdirAll(filepath.Join(node, "opt"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/opt", filepath.Join(node, "usr")); err != nil { // absolute: the node's /opt
		t.Fatal(err)
	}
	var rootErr atomic.Pointer[error]
	missing := errors.New("no ancestor process visible")
	rootErr.Store(&missing)
	events := record.NewFakeRecorder(100)
	f := &flexRunnable{
		server: socket.NewServer(noOps{}, testr.New(t)), socket: filepath.Join(dir, "agent.sock"),
		pluginDir: "/usr/plugins", binary: "/bin/true", log: testr.New(t), events: events, node: "n1",
		root: func() (string, error) {
			if err := rootErr.Load(); err != nil {
				return "", *err
			}
			return node, nil
		},
		retry: 20 * time.Millisecond, maxRetry: 50 * time.Millisecond,
	}
	ctx := testenv.Serve(t, "Start", f.Start)
	poll := func(what string, cond func() bool) { t.Helper(); pollFor(ctx, t, what, cond) }
	poll("state naming the missing root", func() bool {
		err := f.State()
		return err != nil && strings.Contains(err.Error(), "find the node's root: no ancestor process visible")
	})
	wantFailedEvent(t, events)

	rootErr.Store(nil)
	driver := filepath.Join(node, "opt", "plugins", flexvolume.Dir, flexvolume.Name)
	poll("driver below the node's root", func() bool { _, err := os.Stat(driver); return err == nil })
	b, err := os.ReadFile(filepath.Join(filepath.Dir(driver), flexvolume.SocketFile))
	if err != nil || strings.TrimSpace(string(b)) != f.socket {
		t.Errorf("socket file beside the driver: %q, %v", b, err)
	}
	if _, err := os.Stat(filepath.Join("/usr/plugins", flexvolume.Dir)); !os.IsNotExist(err) {
		t.Errorf("driver in this process's own /usr: %v", err)
	}
}

// pollFor waits up to 10 s for cond, failing the test with what.
func pollFor(ctx context.Context, t *testing.T, what string, cond func() bool) {
	t.Helper()
	if err := wait.PollUntilContextTimeout(ctx, 10*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
		return cond(), nil
	}); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

// conditions records what a flexRunnable writes as its node's condition.
type conditions struct {
	mu  sync.Mutex
	got []*corev1.NodeCondition
}

func (c *conditions) set(_ context.Context, cond *corev1.NodeCondition) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.got = append(c.got, cond)
	return nil
}

func (c *conditions) last() (*corev1.NodeCondition, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.got) == 0 {
		return nil, false
	}
	return c.got[len(c.got)-1], true
}

// readOnlyDir makes dir read-only for this process: a read-only bind
// mount as root (who ignores mode bits), mode 0555 otherwise.
func readOnlyDir(t *testing.T, dir string) {
	t.Helper()
	if os.Geteuid() != 0 {
		if err := os.Chmod(dir, 0o555); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = os.Chmod(dir, 0o755) })
		return
	}
	if err := unix.Mount(dir, dir, "", unix.MS_BIND, ""); err != nil {
		t.Skipf("bind mount %s: %v", dir, err)
	}
	t.Cleanup(func() { _ = unix.Unmount(dir, unix.MNT_DETACH) })
	if err := unix.Mount("", dir, "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY, ""); err != nil {
		t.Fatalf("remount %s read-only: %v", dir, err)
	}
}

// TestFlexInstallIntoReadOnlyFolder: a plugin folder where the driver's
// folder cannot be made (a read-only /usr) fails the install without
// ending the runnable: a False condition (InstallFailed, naming the
// cause) and an Event on the node, retried, and no agent socket.
func TestFlexInstallIntoReadOnlyFolder(t *testing.T) {
	dir := t.TempDir()
	plugins := filepath.Join(dir, "exec")
	if err := os.Mkdir(plugins, 0o755); err != nil {
		t.Fatal(err)
	}
	readOnlyDir(t, plugins)
	events, conds := record.NewFakeRecorder(100), &conditions{}
	f := &flexRunnable{
		server: socket.NewServer(noOps{}, testr.New(t)), socket: filepath.Join(dir, "agent.sock"),
		pluginDir: plugins, binary: "/bin/true", log: testr.New(t), events: events, node: "n1", condition: conds.set,
		retry: 20 * time.Millisecond, maxRetry: 50 * time.Millisecond,
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- f.Start(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Start: %v", err)
		}
	}()

	err := wait.PollUntilContextTimeout(ctx, 10*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
		conds.mu.Lock()
		defer conds.mu.Unlock()
		return len(conds.got) >= 2, nil // a retry too
	})
	if err != nil {
		t.Fatalf("no failed install reported twice: %v", err)
	}
	c, _ := conds.last()
	if c == nil || c.Status != corev1.ConditionFalse || c.Reason != reasonFlexInstallFailed ||
		!(strings.Contains(c.Message, "read-only file system") || strings.Contains(c.Message, "permission denied")) {
		t.Errorf("condition %+v, want False, InstallFailed, naming the read-only folder", c)
	}
	wantFailedEvent(t, events)
	select {
	case err := <-done:
		t.Fatalf("Start returned while the install fails: %v", err)
	default:
	}
	if _, err := os.Stat(f.socket); !os.IsNotExist(err) {
		t.Errorf("agent socket before the driver is installed: %v", err)
	}
	if err := f.State(); err == nil || !strings.Contains(err.Error(), "install failed") {
		t.Errorf("state %v, want the failed install", err)
	}
}

// TestFlexDisabledRemovesCondition: without a plugin folder nothing is
// installed, the node's condition is removed, and the socket still
// serves a driver installed before.
func TestFlexDisabledRemovesCondition(t *testing.T) {
	dir := t.TempDir()
	conds := &conditions{}
	f := &flexRunnable{
		server: socket.NewServer(noOps{}, testr.New(t)), socket: filepath.Join(dir, "agent.sock"),
		log: testr.New(t), node: "n1", condition: conds.set,
	}
	ctx := testenv.Serve(t, "Start", f.Start)
	if err := wait.PollUntilContextTimeout(ctx, 10*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
		_, err := os.Stat(f.socket)
		return err == nil, nil
	}); err != nil {
		t.Fatalf("no agent socket without a plugin folder: %v", err)
	}
	if c, ok := conds.last(); !ok || c != nil || len(conds.got) != 1 {
		t.Errorf("conditions written %v, want one removal", conds.got)
	}
	if err := f.State(); err != nil {
		t.Errorf("state %v, want ready", err)
	}
}

// TestFlexDriverRemovedOnlyWhenUnused: as the agent stops, the driver it
// installed goes only when no StorageCluster is left (a real API server)
// and no pod on the node has a berth Flexvolume mount; otherwise it stays.
func TestFlexDriverRemovedOnlyWhenUnused(t *testing.T) {
	env := suite.Require(t)
	if os.Geteuid() != 0 {
		t.Skip("the agent socket admits only root peers; run as root")
	}
	ctx := testenv.Context(t, time.Minute)
	kubelet := t.TempDir()
	removable := flexRemovable(env.Client, kubelet)
	want := func(what string, wantOK bool, wantWhy string) {
		t.Helper()
		why, ok := removable(ctx)
		if ok != wantOK || !strings.Contains(why, wantWhy) {
			t.Errorf("%s: removable %v (%q), want %v (%q)", what, ok, why, wantOK, wantWhy)
		}
	}

	sc := &v1.StorageCluster{ObjectMeta: metav1.ObjectMeta{Name: "flex-left"}}
	if err := env.Client.Create(ctx, sc); err != nil {
		t.Fatal(err)
	}
	want("a StorageCluster left", false, "StorageCluster flex-left is left")
	if err := env.Client.Delete(ctx, sc); err != nil {
		t.Fatal(err)
	}
	mount := filepath.Join(kubelet, "pods", "0b5e2c1a", "volumes", flexvolume.Dir, "data")
	if err := os.MkdirAll(mount, 0o755); err != nil {
		t.Fatal(err)
	}
	want("a pod's Flexvolume mount", false, "1 berth Flexvolume mount(s) on the node, such as "+mount)
	if err := os.Remove(mount); err != nil {
		t.Fatal(err)
	}
	want("nothing left", true, "")
	if why, ok := flexRemovable(env.Client, "")(ctx); ok || !strings.Contains(why, "no kubelet dir") {
		t.Errorf("without a kubelet dir: removable %v (%q)", ok, why)
	}

	// The runnable removes the driver it installed as it stops, when
	// allowed, and keeps it otherwise.
	for _, allow := range []bool{false, true} {
		dir := t.TempDir()
		f := &flexRunnable{
			server: socket.NewServer(noOps{}, testr.New(t)), socket: filepath.Join(dir, "agent.sock"),
			pluginDir: filepath.Join(dir, "exec"), binary: "/bin/true", log: testr.New(t), node: "n1",
			retry: 20 * time.Millisecond, maxRetry: 50 * time.Millisecond,
			removable: func(context.Context) (string, bool) { return "test", allow },
		}
		runCtx, stop := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- f.Start(runCtx) }()
		driver := filepath.Join(f.pluginDir, flexvolume.Dir, flexvolume.Name)
		if err := wait.PollUntilContextTimeout(ctx, 10*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
			_, err := os.Stat(driver)
			return err == nil, nil
		}); err != nil {
			t.Fatalf("driver not installed: %v", err)
		}
		stop()
		if err := <-done; err != nil {
			t.Fatalf("Start: %v", err)
		}
		_, err := os.Stat(filepath.Join(f.pluginDir, flexvolume.Dir))
		if gone := os.IsNotExist(err); gone != allow {
			t.Errorf("removal allowed %v: driver folder gone %v (%v)", allow, gone, err)
		}
	}
}
