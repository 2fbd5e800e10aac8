package agent

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	v1 "github.com/berth-io/berth/api/v1alpha1"
	"github.com/berth-io/berth/internal/blockdev"
	"github.com/berth-io/berth/internal/blockdev/launch"
	"github.com/berth-io/berth/internal/blockdev/rbdimage"
	"github.com/berth-io/berth/internal/keeper"
)

// hostKeeper is a keeper in another PID namespace: the pid it reports for
// a volume's server names some other process in the agent's namespace.
type hostKeeper struct {
	mu     sync.Mutex
	vols   []keeper.Volume
	stops  []string
	closes []string
}

func (k *hostKeeper) Ping(context.Context) error { return nil }
func (k *hostKeeper) List(context.Context) ([]keeper.Volume, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	return append([]keeper.Volume(nil), k.vols...), nil
}
func (k *hostKeeper) Status(ctx context.Context, volume string) (keeper.Volume, bool, error) {
	vols, _ := k.List(ctx)
	for _, v := range vols {
		if v.Name == volume {
			return v, true, nil
		}
	}
	return keeper.Volume{}, false, nil
}
func (k *hostKeeper) Close(_ context.Context, v string) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.closes = append(k.closes, v)
	k.vols = nil
	return nil
}
func (k *hostKeeper) Stop(_ context.Context, v string) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.stops = append(k.stops, v)
	return nil
}

// TestStopNeverByKeeperPID: the keeper (host PID namespace) reports pid N
// for the volume's server; in the agent's namespace N is an unrelated
// process (here a real sleep). Unstaging must stop the server through the
// keeper and leave process N alone.
func TestStopNeverByKeeperPID(t *testing.T) {
	bystander := exec.Command("sleep", "60")
	if err := bystander.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = bystander.Process.Kill(); _ = bystander.Wait() })
	fd, err := unix.PidfdOpen(bystander.Process.Pid, 0)
	if err != nil {
		t.Skipf("pidfd_open: %v", err)
	}
	defer unix.Close(fd)

	k := &hostKeeper{vols: []keeper.Volume{{Name: "vol-1", Mountpoint: "/x", ServerPID: bystander.Process.Pid}}}
	a := newTestAgent(t, Config{Images: fakeImages{path: "/images/vol-1.img"},
		Userspace: &UserspaceConfig{Root: t.TempDir(), Keeper: k, StopPID: launch.StopPID, StopTimeout: 2 * time.Second}})
	// The layout of agents before records: the server log marks a FUSE
	// volume; the upgraded agent must still find it and stop it.
	if err := os.WriteFile(serverLog(a.us.Root, "vol-1"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	d, err := a.device("vol-1")
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := d.(fuseDevice); !ok {
		t.Fatalf("volume of the old FUSE layout taken for %T", d)
	}
	if err := a.stopDevice(context.Background(), "vol-1", d); err != nil {
		t.Fatal(err)
	}
	if _, found, err := a.records().load("vol-1"); err != nil || found {
		t.Errorf("old FUSE marker left: %t, %v", found, err)
	}
	fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
	if n, _ := unix.Poll(fds, 200); n > 0 {
		t.Fatal("the agent signalled the pid the keeper reported: an unrelated process in its namespace died")
	}
	if len(k.stops) != 1 || len(k.closes) != 1 {
		t.Errorf("keeper stops %v, closes %v; want the server stopped and the connection closed through the keeper", k.stops, k.closes)
	}
}

// stoppable is a server this agent started, with its own handle.
type stoppable struct {
	pid     int
	stopped *int
}

func (s stoppable) PID() int { return s.pid }
func (s stoppable) Stop(time.Duration) error {
	*s.stopped++
	return nil
}

// TestStopOwnServerByHandle: a server this agent started is stopped through
// the handle the agent holds.
func TestStopOwnServerByHandle(t *testing.T) {
	k := &hostKeeper{vols: []keeper.Volume{{Name: "vol-1", Mountpoint: "/x", ServerPID: 1 << 22}}}
	stopped := 0
	a := newTestAgent(t, Config{Images: fakeImages{path: "/images/vol-1.img"},
		Userspace: &UserspaceConfig{Root: t.TempDir(), Keeper: k, StopTimeout: time.Second,
			Start: func(context.Context, launch.Params) (Server, error) {
				return stoppable{pid: 7, stopped: &stopped}, nil
			}}})
	if _, err := fuseOf(a).start(context.Background(), launch.Params{Volume: "vol-1"}); err != nil {
		t.Fatal(err)
	}
	if err := a.stopDevice(context.Background(), "vol-1", fuseOf(a)); err != nil {
		t.Fatal(err)
	}
	if stopped != 1 {
		t.Errorf("own server stopped %d times by its handle, want 1", stopped)
	}
	if _, err := os.Stat(serverLog(a.us.Root, "vol-1")); !os.IsNotExist(err) {
		t.Errorf("server log of vol-1 left: %v", err)
	}
}

// TestServerBinaryPerImage: the servers of file images run the slim
// binary and those of rbd images its ceph build, when there are; else the
// full one.
func TestServerBinaryPerImage(t *testing.T) {
	images := []string{"/images/vol-1.img", rbdimage.Spec("/images/vol-1.rbd")}
	for _, c := range []struct {
		slim, ceph string
		want       []string
	}{
		{"/bin/berth-blockdev", "/bin/berth-blockdev-ceph", []string{"/bin/berth-blockdev", "/bin/berth-blockdev-ceph"}},
		{"/bin/berth-blockdev", "", []string{"/bin/berth-blockdev", "/bin/berth"}},
		{"", "", []string{"/bin/berth", "/bin/berth"}},
	} {
		var ran []string
		a := newTestAgent(t, Config{Images: fakeImages{path: "/images/vol-1.img"},
			Userspace: &UserspaceConfig{Root: t.TempDir(), Keeper: &hostKeeper{}, Binary: "/bin/berth", SlimBinary: c.slim, CephBinary: c.ceph,
				Start: func(_ context.Context, p launch.Params) (Server, error) {
					ran = append(ran, p.Binary)
					return stoppable{pid: 7, stopped: new(int)}, nil
				}}})
		for _, img := range images {
			if _, err := fuseOf(a).start(context.Background(), launch.Params{Volume: "vol-1", Image: img}); err != nil {
				t.Fatal(err)
			}
		}
		if !slices.Equal(ran, c.want) {
			t.Errorf("slim %q, ceph %q: servers ran %v, want %v (file image, rbd image)", c.slim, c.ceph, ran, c.want)
		}
	}
}

// fuseOf is the agent's FUSE device.
func fuseOf(a *Agent) fuseDevice { return a.transports()[TransportFUSE].(fuseDevice) }

// TestFakeStageRefusesKeeperOutOfSight: the keeper mounts the volume's FUSE
// connection where this agent cannot see it (another mount namespace).
// The stage is refused with an error naming the keeper's socket, the
// paths and the fix, and leaves nothing behind: the real keeper in another
// mount namespace is in test/userspace (TestKeeperInOtherMountNamespace).
func TestFakeStageRefusesKeeperOutOfSight(t *testing.T) {
	e := newStageEnvOf(t, false, func(v *v1.Volume) { v.Spec.Mounter = v1.MounterUserspace })
	k := &hostKeeper{}
	stopped := 0
	root := t.TempDir()
	e.cfg.Userspace = &UserspaceConfig{Root: root, Binary: "/usr/bin/berth", KeeperSocket: "/run/berth/keeper.sock", Keeper: k,
		Start: func(_ context.Context, p launch.Params) (Server, error) {
			k.mu.Lock()
			defer k.mu.Unlock()
			k.vols = append(k.vols, keeper.Volume{Name: p.Volume, Mountpoint: p.Mountpoint, ServerPID: 77})
			return stoppable{pid: 7, stopped: &stopped}, nil
		},
		FUSEMounted: func(string) (bool, error) { return false, nil },
	}
	e.agent = newTestAgent(t, e.cfg)
	err := e.stage(t)
	if !errors.Is(err, ErrKeeperNotShared) || !errors.Is(err, ErrUnsupported) {
		t.Fatalf("stage with the keeper's mount out of sight: %v, want ErrKeeperNotShared (ErrUnsupported)", err)
	}
	for _, want := range []string{"/run/berth/keeper.sock", filepath.Join(root, "vol-a"), filepath.Join(root, "vol-a", blockdev.FileName),
		"--run-dir", "mountPropagation Bidirectional"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("refusal %q does not name %q", err, want)
		}
	}
	e.leftNothing(t, "a keeper out of sight")
	if stopped != 1 || len(k.closes) != 1 || len(k.vols) != 0 {
		t.Errorf("server stopped %d times, keeper closes %v, held %v; want the server and connection gone", stopped, k.closes, k.vols)
	}
	if _, found, err := e.agent.records().load("vol-a"); err != nil || found {
		t.Errorf("record left: %t, %v", found, err)
	}
	if left, _ := filepath.Glob(filepath.Join(root, "vol-a*")); len(left) != 0 {
		t.Errorf("files left: %v", left)
	}
}
