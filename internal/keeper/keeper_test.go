package keeper_test

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"golang.org/x/sys/unix"

	"github.com/berth-io/berth/internal/keeper"
	"github.com/berth-io/berth/internal/testenv"
	"github.com/berth-io/berth/internal/volerr"
)

// fakeKernel hands out pipe fds instead of /dev/fuse and records mounts: the
// request handling and the real fd passing are tested without mounting (the
// real kernel path is tested in internal/blockdev).
type fakeKernel struct {
	mu       sync.Mutex
	mounts   map[string]int
	foreign  map[string]bool // mounted by someone else
	closed   []int
	mountErr error
	// fuseErr fails CheckFUSE; unmounts counts Unmount calls.
	fuseErr  error
	unmounts int
	// pids maps the inode of a watched process's pipe to its pid, so that
	// a pipe passed in a hand-over is adopted as that process.
	pids map[uint64]int32
}

func newFakeKernel() *fakeKernel {
	return &fakeKernel{mounts: map[string]int{}, foreign: map[string]bool{}, pids: map[uint64]int32{}}
}

// counts reads the mounts, closed fds and unmounts under the lock: the
// keeper's goroutines write them.
func (k *fakeKernel) counts() (mounts, closed, unmounts int) {
	k.mu.Lock()
	defer k.mu.Unlock()
	return len(k.mounts), len(k.closed), k.unmounts
}

// pipeFD is the read end of a new pipe, and its inode.
func pipeFD() (int, uint64, error) {
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
		return -1, 0, err
	}
	_ = unix.Close(p[1])
	var st unix.Stat_t
	if err := unix.Fstat(p[0], &st); err != nil {
		_ = unix.Close(p[0])
		return -1, 0, err
	}
	return p[0], st.Ino, nil
}

func (k *fakeKernel) OpenFUSE() (int, error) {
	fd, _, err := pipeFD()
	return fd, err
}

func (k *fakeKernel) MountFUSE(fd int, _, mountpoint string) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.mountErr != nil {
		return k.mountErr
	}
	k.mounts[mountpoint] = fd
	return nil
}

func (k *fakeKernel) Unmount(mountpoint string) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.unmounts++
	delete(k.mounts, mountpoint)
	return nil
}

func (k *fakeKernel) Mounted(mountpoint string) (bool, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	_, ok := k.mounts[mountpoint]
	return ok || k.foreign[mountpoint], nil
}

func (k *fakeKernel) CloseFD(fd int) error {
	k.mu.Lock()
	k.closed = append(k.closed, fd)
	k.mu.Unlock()
	return unix.Close(fd)
}

// WatchProcess: the test process is the only client, and it lives.
func (k *fakeKernel) WatchProcess(pid int32) (keeper.Process, error) {
	fd, ino, err := pipeFD()
	if err != nil {
		return nil, err
	}
	k.mu.Lock()
	k.pids[ino] = pid
	k.mu.Unlock()
	return aliveProcess(fd), nil
}

func (k *fakeKernel) CheckFUSE(fd int) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.fuseErr != nil {
		return k.fuseErr
	}
	var st unix.Stat_t
	return unix.Fstat(fd, &st)
}

func (k *fakeKernel) AdoptProcess(fd int) (keeper.Process, int32, error) {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, 0, err
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	pid, ok := k.pids[st.Ino]
	if !ok {
		return nil, 0, errors.New("passed fd is no watched process")
	}
	return aliveProcess(fd), pid, nil
}

// aliveProcess is a live process whose pidfd is a pipe, so that a
// hand-over passes a real fd.
type aliveProcess int

func (aliveProcess) Alive() bool              { return true }
func (aliveProcess) Stop(time.Duration) error { return nil }
func (p aliveProcess) Release()               { _ = unix.Close(int(p)) }
func (p aliveProcess) FD() int                { return int(p) }

// listenRoot makes a keeper socket in a folder of the test; it skips
// without root, the only peer a keeper admits.
func listenRoot(t *testing.T) (*net.UnixListener, string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("the keeper admits only root peers; run as root")
	}
	sock := filepath.Join(t.TempDir(), "run", "keeper.sock")
	l, err := keeper.Listen(sock)
	if err != nil {
		t.Fatal(err)
	}
	return l, sock
}

func startKeeper(t *testing.T, k keeper.Kernel) *keeper.Client {
	t.Helper()
	l, sock := listenRoot(t)
	ctx := testenv.Serve(t, "Serve", func(ctx context.Context) error { return keeper.New(k, logr.Discard()).Serve(ctx, l) })
	st, err := os.Stat(sock)
	if err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("socket mode = %v, %v; want 0600", st.Mode(), err)
	}
	dst, err := os.Stat(filepath.Dir(sock))
	if err != nil || dst.Mode().Perm() != 0o700 {
		t.Fatalf("socket folder mode = %v, %v; want 0700", dst.Mode(), err)
	}
	c, err := keeper.Dial(ctx, sock)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestOpenSaveGetClose(t *testing.T) {
	k := newFakeKernel()
	c := startKeeper(t, k)
	ctx := context.Background()

	first, err := c.Open(ctx, "vol1", "/mnt/vol1")
	if err != nil {
		t.Fatal(err)
	}
	defer first.File.Close()
	if first.Settings != nil {
		t.Fatalf("fresh open has settings %q", first.Settings)
	}
	if err := c.SaveInit(ctx, "vol1", []byte(`{"out":{"major":7}}`)); err != nil {
		t.Fatal(err)
	}
	// Open again (a restarted server) is idempotent and returns the settings.
	again, err := c.Open(ctx, "vol1", "/mnt/vol1")
	if err != nil {
		t.Fatal(err)
	}
	defer again.File.Close()
	if string(again.Settings) != `{"out":{"major":7}}` {
		t.Fatalf("settings = %q", again.Settings)
	}
	if mounts, _, _ := k.counts(); mounts != 1 {
		t.Fatalf("mounted %d times, want once", mounts)
	}
	// The passed fd is the keeper's connection: same file description.
	var a, b unix.Stat_t
	if err := unix.Fstat(int(first.File.Fd()), &a); err != nil {
		t.Fatal(err)
	}
	if err := unix.Fstat(int(again.File.Fd()), &b); err != nil {
		t.Fatal(err)
	}
	if a.Ino != b.Ino {
		t.Fatal("the two opens passed different connections")
	}
	got, err := c.Get(ctx, "vol1")
	if err != nil {
		t.Fatal(err)
	}
	_ = got.File.Close()
	vols, err := c.List(ctx)
	if err != nil || len(vols) != 1 || vols[0] != (keeper.Volume{Name: "vol1", Mountpoint: "/mnt/vol1", Initialized: true, ServerPID: os.Getpid()}) {
		t.Fatalf("List = %+v, %v", vols, err)
	}
	if err := c.Close(ctx, "vol1"); err != nil {
		t.Fatal(err)
	}
	if err := c.Close(ctx, "vol1"); err != nil {
		t.Fatalf("second close: %v", err)
	}
	if mounts, closed, _ := k.counts(); mounts != 0 || closed != 1 {
		t.Fatalf("after close: %d mounts, %d fds closed", mounts, closed)
	}
	if _, err := c.Get(ctx, "vol1"); !errors.Is(err, keeper.ErrNotFound) {
		t.Fatalf("Get after close = %v, want ErrNotFound", err)
	}
}

func TestRefusals(t *testing.T) {
	k := newFakeKernel()
	k.foreign["/mnt/stale"] = true
	c := startKeeper(t, k)
	ctx := context.Background()
	conn, err := c.Open(ctx, "vol1", "/mnt/vol1")
	if err != nil {
		t.Fatal(err)
	}
	_ = conn.File.Close()
	for _, tc := range []struct {
		name string
		call func() error
		want error
	}{
		{"other mountpoint", func() error { _, err := c.Open(ctx, "vol1", "/mnt/other"); return err }, keeper.ErrConflict},
		{"mountpoint of another volume", func() error { _, err := c.Open(ctx, "vol2", "/mnt/vol1"); return err }, keeper.ErrConflict},
		{"stale mount", func() error { _, err := c.Open(ctx, "vol3", "/mnt/stale"); return err }, keeper.ErrConflict},
		{"relative mountpoint", func() error { _, err := c.Open(ctx, "vol4", "mnt"); return err }, volerr.ErrInvalid},
		{"bad name", func() error { _, err := c.Open(ctx, "../x", "/mnt/x"); return err }, volerr.ErrInvalid},
		{"save unknown", func() error { return c.SaveInit(ctx, "nope", []byte(`{}`)) }, keeper.ErrNotFound},
		{"save non-JSON", func() error { return c.SaveInit(ctx, "vol1", []byte(`{`)) }, volerr.ErrInvalid},
	} {
		if err := tc.call(); !errors.Is(err, tc.want) {
			t.Errorf("%s: err = %v, want %v", tc.name, err, tc.want)
		}
	}
	if mounts, _, _ := k.counts(); mounts != 1 {
		t.Fatalf("refused requests changed mounts: %d", mounts)
	}
	k.mu.Lock()
	k.mountErr = errors.New("mount failed")
	k.mu.Unlock()
	if _, err := c.Open(ctx, "vol5", "/mnt/vol5"); err == nil {
		t.Fatal("open with a failing mount succeeded")
	}
	if _, closed, _ := k.counts(); closed != 1 {
		t.Fatalf("the fd of a failed mount was not closed: %d closed", closed)
	}
	if vols, _ := c.List(ctx); len(vols) != 1 {
		t.Fatalf("failed open left state: %+v", vols)
	}
}

func TestUnavailable(t *testing.T) {
	c := keeper.NewClient(filepath.Join(t.TempDir(), "none.sock"))
	if err := c.Ping(context.Background()); !errors.Is(err, keeper.ErrUnavailable) {
		t.Fatalf("Ping = %v, want ErrUnavailable", err)
	}
}
