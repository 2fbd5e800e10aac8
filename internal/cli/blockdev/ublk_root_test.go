package blockdev

import (
	"bufio"
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"

	"github.com/berth-io/berth/internal/blockdev/ublk"
)

// needUblk skips unless the test can drive the real ublk driver (on the VM
// node: modprobe ublk_drv first).
func needUblk(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: adds ublk devices")
	}
	if err := ublk.NewDevices(ublk.ControlConfig{}).Probe(); err != nil {
		t.Skipf("needs /dev/ublk-control with user recovery (CONFIG_BLK_DEV_UBLK, kernel >= 6.0): %v", err)
	}
}

// runServer runs `berth blockdev --transport ublk` as Config and returns
// its ready line's device, and its end.
func runServer(ctx context.Context, t *testing.T, cfg Config) (string, <-chan error) {
	t.Helper()
	r, fd := readyPipe(t)
	cfg.Transport, cfg.ReadyFD, cfg.Log = "ublk", fd, testr.New(t)
	done := make(chan error, 1)
	go func() { done <- cfg.Run(ctx) }()
	line, err := bufio.NewReader(r).ReadString('\n')
	dev, ok := strings.CutPrefix(strings.TrimSpace(line), "ready ")
	if err != nil || !ok {
		t.Fatalf("ready line %q, %v (server: %v)", line, err, <-done)
	}
	return dev, done
}

// TestUblkServerDeathAndRecover: the server command serves an image file
// on a new ublk device; it dies (its context ends) while a write waits on
// the device, and a second server, given the device, recovers it: the
// write completes without an error and reaches the image. Stopping the
// device then ends the server, and the device can be deleted.
func TestUblkServerDeathAndRecover(t *testing.T) {
	needUblk(t)
	const size = 32 << 20
	image := filepath.Join(t.TempDir(), "disk.img")
	if err := os.WriteFile(image, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(image, size); err != nil {
		t.Fatal(err)
	}
	ctx, die := context.WithCancel(context.Background())
	dev, done := runServer(ctx, t, Config{Volume: "v", Image: image, Direct: true})
	idText, ok := strings.CutPrefix(dev, "/dev/ublkb")
	id, err := strconv.ParseUint(idText, 10, 32)
	if !ok || err != nil {
		t.Fatalf("device %q is no ublk block device", dev)
	}
	devs := ublk.NewDevices(ublk.ControlConfig{})
	defer func() {
		_ = devs.Stop(uint32(id))
		_ = devs.Delete(uint32(id))
	}()
	f, err := os.OpenFile(dev, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteAt(bytes.Repeat([]byte{1}, 4096), 0); err != nil {
		t.Fatal(err)
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}

	die()
	if err := <-done; err != nil {
		t.Fatalf("server at its context's end: %v, want nil", err)
	}
	wrote := make(chan error, 1)
	go func() {
		_, err := f.WriteAt(bytes.Repeat([]byte{2}, 4096), 1<<20)
		if err == nil {
			err = f.Sync()
		}
		wrote <- err
	}()
	select {
	case err := <-wrote:
		t.Fatalf("a write without a server ended: %v", err)
	case <-time.After(500 * time.Millisecond):
	}
	dev32 := uint32(id)
	again, done := runServer(context.Background(), t, Config{Volume: "v", Image: image, Direct: true, UblkRecover: &dev32})
	if again != dev {
		t.Fatalf("recovered %s, want %s", again, dev)
	}
	select {
	case err := <-wrote:
		if err != nil {
			t.Fatalf("the write queued while no server ran: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the write queued while no server ran never completed")
	}
	img, err := os.ReadFile(image)
	if err != nil {
		t.Fatal(err)
	}
	if img[0] != 1 || img[1<<20] != 2 {
		t.Errorf("image holds %d and %d, want 1 and 2", img[0], img[1<<20])
	}
	_ = f.Close()
	if err := devs.Stop(dev32); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("server after its device stopped: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("server still running after its device stopped")
	}
	if err := devs.Delete(dev32); err != nil {
		t.Fatal(err)
	}
}
