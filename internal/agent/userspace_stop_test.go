package agent

import (
	"context"
	"os"
	"os/exec"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"golang.org/x/sys/unix"

	"github.com/berth-io/berth/internal/blockdev/launch"
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
	a := New("node-a", nil, fakeImages{path: "/images/vol-1.img"}, nil, nil, nil, NewVolumeLocks(), logr.Discard())
	a.WithUserspace(UserspaceConfig{Root: t.TempDir(), Keeper: k, StopPID: launch.StopPID, StopTimeout: 2 * time.Second})
	if err := os.WriteFile(a.usLog("vol-1"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := a.stopUserspace(context.Background(), "vol-1"); err != nil {
		t.Fatal(err)
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
	a := New("node-a", nil, fakeImages{path: "/images/vol-1.img"}, nil, nil, nil, NewVolumeLocks(), logr.Discard())
	a.WithUserspace(UserspaceConfig{Root: t.TempDir(), Keeper: k, StopTimeout: time.Second,
		Start: func(context.Context, launch.Params) (Server, error) {
			return stoppable{pid: 7, stopped: &stopped}, nil
		}})
	if _, err := a.startServer(context.Background(), launch.Params{Volume: "vol-1"}); err != nil {
		t.Fatal(err)
	}
	if err := a.stopUserspace(context.Background(), "vol-1"); err != nil {
		t.Fatal(err)
	}
	if stopped != 1 {
		t.Errorf("own server stopped %d times by its handle, want 1", stopped)
	}
	if _, err := os.Stat(a.usLog("vol-1")); !os.IsNotExist(err) {
		t.Errorf("record of vol-1 left: %v", err)
	}
}
