package keeper_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/go-logr/logr"

	"github.com/berth-io/berth/internal/keeper"
	"github.com/berth-io/berth/internal/testenv"
)

// serve starts a keeper over k with log and returns its socket.
func serve(t *testing.T, k keeper.Kernel, log logr.Logger) string {
	t.Helper()
	return serveService(t, keeper.New(k, log))
}

func serveService(t *testing.T, svc *keeper.Service) string {
	t.Helper()
	l, sock := listenRoot(t)
	testenv.Serve(t, "Serve", func(ctx context.Context) error { return svc.Serve(ctx, l) })
	return sock
}

// TestAcceptSurvivesEMFILE runs the real keeper out of file descriptors:
// accept fails with EMFILE, and once descriptors are free again the keeper
// answers the waiting client. Exiting on that error would have dropped
// every FUSE connection of the node.
func TestAcceptSurvivesEMFILE(t *testing.T) {
	log := &testenv.EMFILELog{}
	sock := serve(t, newFakeKernel(), log.Logger())
	c := keeper.NewClient(sock)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := c.Ping(ctx); err != nil {
		t.Fatal(err)
	}
	if err := testenv.OutOfFDs(t, log, func() error { return c.Ping(ctx) }); err != nil {
		t.Fatalf("client waiting while the keeper had no descriptors: %v", err)
	}
	if err := c.Ping(ctx); err != nil {
		t.Fatalf("keeper after EMFILE: %v", err)
	}
}

// TestTooManyClientsBusy: over MaxConns, a client is told the keeper is
// busy at once; once the slot frees, it is served again.
func TestTooManyClientsBusy(t *testing.T) {
	svc := keeper.New(newFakeKernel(), logr.Discard())
	svc.MaxConns = 1
	sock := serveService(t, svc)
	hold, err := net.Dial("unixpacket", sock) // takes the slot, sends nothing
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c := keeper.NewClient(sock)
	if err := c.Ping(ctx); !errors.Is(err, keeper.ErrBusy) {
		t.Errorf("client over the limit: %v, want ErrBusy", err)
	}
	_ = hold.Close()
	time.Sleep(50 * time.Millisecond)
	if err := c.Ping(ctx); err != nil {
		t.Errorf("client after the slot freed: %v", err)
	}
}

// hangKernel is fakeKernel whose mount of one mountpoint hangs until
// released (a mount syscall stuck in the kernel).
type hangKernel struct {
	*fakeKernel
	hang    string
	release chan struct{}
}

func (k *hangKernel) MountFUSE(fd int, source, mountpoint string) error {
	if mountpoint == k.hang {
		<-k.release
	}
	return k.fakeKernel.MountFUSE(fd, source, mountpoint)
}

// TestServesOthersWhileOneHangs: while the mount of one volume hangs, other
// clients are served: list, and open, get and close of other volumes.
func TestServesOthersWhileOneHangs(t *testing.T) {
	k := &hangKernel{fakeKernel: newFakeKernel(), hang: "/mnt/hang", release: make(chan struct{})}
	sock := serve(t, k, logr.Discard())
	c := keeper.NewClient(sock)
	hung := make(chan error, 1)
	go func() {
		conn, err := c.Open(context.Background(), "hang", "/mnt/hang")
		if err == nil {
			_ = conn.File.Close()
		}
		hung <- err
	}()
	defer func() {
		close(k.release)
		<-hung
	}()
	time.Sleep(100 * time.Millisecond) // the hanging open is in the kernel
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	if _, err := c.List(ctx); err != nil {
		t.Fatalf("list while a mount hangs: %v", err)
	}
	conn, err := c.Open(ctx, "other", "/mnt/other")
	if err != nil {
		t.Fatalf("open of another volume while a mount hangs: %v", err)
	}
	_ = conn.File.Close()
	if conn, err = c.Get(ctx, "other"); err != nil {
		t.Fatalf("get of another volume while a mount hangs: %v", err)
	}
	_ = conn.File.Close()
	if err := c.Close(ctx, "other"); err != nil {
		t.Fatalf("close of another volume while a mount hangs: %v", err)
	}
	// The same mountpoint for another volume is refused, not mounted twice.
	if _, err := c.Open(ctx, "hang2", "/mnt/hang"); !errors.Is(err, keeper.ErrConflict) {
		t.Errorf("open of a mountpoint being mounted: %v, want ErrConflict", err)
	}
	// An operation on the hanging volume itself waits its turn, bounded.
	short, cancelShort := context.WithTimeout(context.Background(), 12*time.Second)
	defer cancelShort()
	start := time.Now()
	if _, err := c.Get(short, "hang"); err == nil {
		t.Error("get of a volume whose open hangs succeeded")
	} else if time.Since(start) > 11*time.Second {
		t.Errorf("get of a hanging volume took %s", time.Since(start))
	}
}

// watchingKernel is fakeKernel with the real process watcher (pidfds).
type watchingKernel struct{ *fakeKernel }

func (watchingKernel) WatchProcess(pid int32) (keeper.Process, error) {
	return keeper.HostKernel{}.WatchProcess(pid)
}

// TestStopThroughKeeper: a server process (this test binary, re-run as a
// client that opens a volume and waits) is stopped through the keeper's
// pidfd, the way an agent in another PID namespace must stop it.
func TestStopThroughKeeper(t *testing.T) {
	sock := serve(t, watchingKernel{newFakeKernel()}, logr.Discard())
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperServer$")
	cmd.Env = append(os.Environ(), "KEEPER_TEST_SERVER="+sock)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() { _ = cmd.Process.Kill() })
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil || line != "ready\n" {
		t.Fatalf("helper server: %q, %v", line, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c := keeper.NewClient(sock)
	vols, err := c.List(ctx)
	if err != nil || len(vols) != 1 || vols[0].ServerPID != cmd.Process.Pid {
		t.Fatalf("list = %+v, %v; want the helper (pid %d) serving", vols, err, cmd.Process.Pid)
	}
	if err := c.Stop(ctx, "vol1"); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-exited:
		t.Logf("server ended: %v", err)
	case <-time.After(5 * time.Second):
		t.Fatal("server still runs after the keeper's stop returned")
	}
	if vols, err := c.List(ctx); err != nil || vols[0].ServerPID != 0 {
		t.Errorf("list after stop = %+v, %v; want no live server", vols, err)
	}
	// No server alive: stop is a no-op.
	if err := c.Stop(ctx, "vol1"); err != nil {
		t.Errorf("second stop: %v", err)
	}
}

// TestHelperServer is the server process of TestStopThroughKeeper.
func TestHelperServer(t *testing.T) {
	sock := os.Getenv("KEEPER_TEST_SERVER")
	if sock == "" {
		t.Skip("helper process of TestStopThroughKeeper")
	}
	conn, err := keeper.NewClient(sock).Open(context.Background(), "vol1", "/mnt/vol1")
	if err != nil {
		fmt.Println("open:", err)
		os.Exit(1)
	}
	defer conn.File.Close()
	fmt.Println("ready")
	time.Sleep(time.Minute)
	os.Exit(2)
}
