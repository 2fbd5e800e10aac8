package nbd

import (
	"bytes"
	"context"
	"crypto/rand"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/berth-io/berth/internal/blockdev/blockdevtest"
	"github.com/berth-io/berth/internal/testenv"
)

// needNBD skips unless the test can drive the real nbd driver.
func needNBD(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: connects nbd devices, mounts")
	}
	if ok, reason := Available("/sys"); !ok {
		t.Skip(reason)
	}
	for _, tool := range []string{"mkfs.ext4", "mount", "umount"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("needs %s (hack/install-deps.sh): %v", tool, err)
		}
	}
}

// TestKernelNBD: a real device with ext4 on it survives its server's death:
// a write issued while no server is connected completes after the next
// server reconnects (NBD_CMD_RECONFIGURE), and the data is all there.
func TestKernelNBD(t *testing.T) {
	needNBD(t)
	k := NewNetlink()
	_, image := blockdevtest.ImageFile(t, 256<<20, true)
	volume := "nbd-test-" + strconv.Itoa(os.Getpid())
	mnt := t.TempDir()
	// Servers stop last: cleanups run in reverse, so unmount comes first,
	// then disconnect (which ends the live server), then this.
	var servers []func()
	t.Cleanup(func() {
		for _, stop := range servers {
			stop()
		}
	})
	start := func(ready chan<- string) (stop func(), done chan error) {
		ctx, cancel := context.WithCancel(context.Background())
		done = make(chan error, 1)
		finished := make(chan struct{})
		go func() {
			defer close(finished)
			done <- Run(ctx, RunConfig{Kernel: k, Volume: volume, Image: image, Direct: true,
				Connections: 2, DeadConnTimeout: 60 * time.Second, Log: testLog(t),
				OnReady: func(dev string) { ready <- dev }})
		}()
		var once sync.Once
		stop = func() { once.Do(func() { cancel(); <-finished }) }
		servers = append(servers, stop)
		return stop, done
	}
	ready := make(chan string, 2)
	stop1, done1 := start(ready)
	var dev string
	select {
	case dev = <-ready:
	case err := <-done1:
		t.Fatalf("first server: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("first server not ready")
	}
	index, err := strconv.Atoi(strings.TrimPrefix(dev, "/dev/nbd"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := k.Disconnect(index); err != nil {
			t.Errorf("disconnect %s: %v", dev, err)
		}
	})
	testenv.Run(t, "mkfs.ext4", "-q", "-F", dev)
	testenv.Run(t, "mount", dev, mnt)
	t.Cleanup(func() { _ = unix.Unmount(mnt, 0) })

	data := make([]byte, 8<<20)
	_, _ = rand.Read(data)
	if err := os.WriteFile(filepath.Join(mnt, "before"), data, 0o600); err != nil {
		t.Fatal(err)
	}
	testenv.Run(t, "sync")

	// The server dies: its sockets close, the kernel queues I/O.
	stop1()
	wrote := make(chan error, 1)
	go func() {
		err := os.WriteFile(filepath.Join(mnt, "during"), data, 0o600)
		if err == nil {
			err = exec.Command("sync").Run()
		}
		wrote <- err
	}()
	time.Sleep(500 * time.Millisecond)

	_, done2 := start(ready)
	select {
	case got := <-ready:
		if got != dev {
			t.Fatalf("second server serves %s, want %s", got, dev)
		}
	case err := <-done2:
		t.Fatalf("second server: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("second server not ready")
	}
	select {
	case err := <-wrote:
		if err != nil {
			t.Fatalf("write across the server restart: %v", err)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("write across the server restart did not complete")
	}
	// Read back from the device, not the page cache.
	if err := unix.Unmount(mnt, 0); err != nil {
		t.Fatal(err)
	}
	testenv.Run(t, "mount", dev, mnt)
	for _, name := range []string{"before", "during"} {
		got, err := os.ReadFile(filepath.Join(mnt, name))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, data) {
			t.Fatalf("%s: data differs after the restart", name)
		}
	}
}
