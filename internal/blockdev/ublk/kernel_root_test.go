package ublk

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// needUblk skips unless the test can drive the real ublk driver: root and
// /dev/ublk-control (on the VM node: modprobe ublk_drv first).
func needUblk(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: adds ublk devices")
	}
	if _, err := os.Stat(ControlPath("")); err != nil {
		t.Skipf("needs the ublk driver (CONFIG_BLK_DEV_UBLK, kernel >= 6.0): this kernel has none (%v)", err)
	}
}

// TestKernelControl: the control commands against the real driver: its
// features, then a device added with recovery, read back and deleted
// without ever starting.
func TestKernelControl(t *testing.T) {
	needUblk(t)
	f, err := Probe(ControlConfig{})
	if err != nil {
		t.Fatalf("Probe: %v (features %#x)", err, f)
	}
	t.Logf("ublk features %#x", f)
	c, err := OpenControl(ControlConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	info, err := c.AddDevice(DevInfo{DevID: AnyDevice, NrHWQueues: 1, QueueDepth: 32,
		MaxIOBufBytes: 256 << 10, Flags: FlagUserRecovery | FlagUserRecoveryReissue})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := c.DeleteDevice(info.DevID); err != nil {
			t.Errorf("DeleteDevice: %v", err)
		}
	}()
	if info.Flags&FlagUserRecoveryReissue == 0 || info.Flags&FlagCmdIoctlEncode == 0 {
		t.Errorf("granted flags %#x lack recovery with reissue or ioctl encoding", info.Flags)
	}
	if _, err := os.Stat(CharPath("", info.DevID)); err != nil {
		t.Errorf("char device: %v", err)
	}
	got, err := c.DeviceInfo(info.DevID)
	if err != nil {
		t.Fatal(err)
	}
	if got.DevID != info.DevID || got.QueueDepth != 32 || got.State != StateDead {
		t.Errorf("DeviceInfo = %+v, want device %d, depth 32, not started", got, info.DevID)
	}
	if err := c.SetParams(info.DevID, Params{LogicalBSShift: 9, PhysicalBSShift: 12,
		MaxSectors: 256 << 10 >> 9, DevSectors: 1 << 11}); err != nil {
		t.Errorf("SetParams: %v", err)
	}
}

// imageAndControl makes an image file of size bytes and opens the control
// device; both close with the test.
func imageAndControl(t *testing.T, size int64) (*os.File, *Control) {
	t.Helper()
	f, err := os.Create(filepath.Join(t.TempDir(), "disk.img"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = f.Close() })
	if err := f.Truncate(size); err != nil {
		t.Fatal(err)
	}
	ctl, err := OpenControl(ControlConfig{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ctl.Close() })
	return f, ctl
}

// fileBackend is an image file with fallocate, as backing.Data has it.
type fileBackend struct{ *os.File }

func (f fileBackend) Fallocate(mode uint32, off, length int64) error {
	return unix.Fallocate(int(f.Fd()), mode, off, length)
}

// TestKernelServeAndRecover: a device served from an image file takes
// writes; its server is stopped (as if killed) while a writer waits on the
// device, and a new server recovers it: the write completes without an
// error, and the image holds every byte written.
func TestKernelServeAndRecover(t *testing.T) {
	needUblk(t)
	const size = 64 << 20
	f, ctl := imageAndControl(t, size)
	ctx := context.Background()
	cfg := ServerConfig{Backend: fileBackend{f}, Size: size}
	s, err := Serve(ctx, ctl, cfg)
	if err != nil {
		t.Fatal(err)
	}
	id := s.ID
	defer func() {
		if err := ctl.StopDevice(id); err != nil {
			t.Errorf("StopDevice: %v", err)
		}
		if err := <-s.Done(); err != nil {
			t.Errorf("server after STOP_DEV: %v", err)
		}
		if err := ctl.DeleteDevice(id); err != nil {
			t.Errorf("DeleteDevice: %v", err)
		}
	}()

	dev, err := os.OpenFile(BlockPath("", id), os.O_RDWR|unix.O_DIRECT, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer dev.Close()
	block := func(fill byte) []byte {
		b, err := unix.Mmap(-1, 0, 1<<20, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = unix.Munmap(b) })
		for i := range b {
			b[i] = fill
		}
		return b
	}
	if _, err := dev.WriteAt(block(1), 0); err != nil {
		t.Fatalf("write: %v", err)
	}
	if err := dev.Sync(); err != nil {
		t.Fatalf("fsync: %v", err)
	}
	got := block(0)
	if _, err := dev.ReadAt(got, 0); err != nil || !bytes.Equal(got, block(1)) {
		t.Fatalf("read back: %v (first byte %d)", err, got[0])
	}

	// The server dies; a write issued now waits in the kernel's queue.
	s.Stop()
	if err := <-s.Done(); !errors.Is(err, context.Canceled) {
		t.Fatalf("stopped server: %v", err)
	}
	info, err := ctl.DeviceInfo(id)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("without a server: state %d", info.State)
	wrote := make(chan error, 1)
	go func() {
		_, err := dev.WriteAt(block(2), 1<<20)
		if err == nil {
			err = dev.Sync()
		}
		wrote <- err
	}()
	select {
	case err := <-wrote:
		t.Fatalf("a write without a server ended: %v", err)
	case <-time.After(500 * time.Millisecond):
	}
	if s, err = Recover(ctx, ctl, id, cfg); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-wrote:
		if err != nil {
			t.Fatalf("the write queued during recovery: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the write queued during recovery never completed")
	}
	img := make([]byte, 2<<20)
	if _, err := f.ReadAt(img, 0); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(img[:1<<20], block(1)) || !bytes.Equal(img[1<<20:], block(2)) {
		t.Error("the image lacks data written before or during recovery")
	}
}

// TestKernelDevices: the agent's view of a served device: found live, by
// number and by its tag, grown where the driver can resize a running device, then stopped (its
// server's queue ends) and deleted.
func TestKernelDevices(t *testing.T) {
	needUblk(t)
	const size = 16 << 20
	f, ctl := imageAndControl(t, size)
	tag := Tag("node-a", "vol-1")
	s, err := Serve(context.Background(), ctl, ServerConfig{Backend: growingFile{fileBackend{f}}, Size: size, Tag: tag})
	if err != nil {
		t.Fatal(err)
	}
	d := NewDevices(ControlConfig{})
	info, found, err := d.Device(s.ID)
	if err != nil || !found || info.State != StateLive || info.ServerFlags != tag {
		t.Fatalf("Device(%d) = %+v, %t, %v; want it live, with its tag", s.ID, info, found, err)
	}
	if got, found, err := d.Find(tag); err != nil || !found || got.DevID != s.ID {
		t.Fatalf("Find(tag) = %+v, %t, %v; want device %d", got, found, err, s.ID)
	}
	if _, found, err := d.Find(Tag("node-a", "vol-2")); err != nil || found {
		t.Fatalf("Find(another tag) = %t, %v; want none", found, err)
	}
	if err := f.Truncate(2 * size); err != nil {
		t.Fatal(err)
	}
	err = d.UpdateSize(s.ID, 2*size)
	switch {
	case info.Flags&FlagUpdateSize == 0:
		if !errors.Is(err, ErrNoUpdateSize) {
			t.Errorf("UpdateSize on a driver without it: %v, want ErrNoUpdateSize", err)
		}
	case err != nil:
		t.Errorf("UpdateSize: %v", err)
	default:
		// A write past the old end reaches the image: the server learns
		// the new size from it.
		dev, err := os.OpenFile(BlockPath("", s.ID), os.O_RDWR, 0)
		if err != nil {
			t.Fatal(err)
		}
		_, werr := dev.WriteAt(bytes.Repeat([]byte{9}, 4096), size)
		if werr == nil {
			werr = dev.Sync()
		}
		dev.Close()
		got := make([]byte, 1)
		if _, err := f.ReadAt(got, size); werr != nil || err != nil || got[0] != 9 {
			t.Errorf("write past the old end: %v, %v, byte %d", werr, err, got[0])
		}
	}
	if err := d.Stop(s.ID); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	if err := <-s.Done(); err != nil {
		t.Errorf("server after Stop: %v", err)
	}
	if err := d.Delete(s.ID); err != nil {
		t.Fatalf("Delete: %v", err)
	}
	if _, found, err := d.Device(s.ID); found || err != nil {
		t.Errorf("after Delete: found %t, %v", found, err)
	}
	if err := d.Stop(s.ID); err != nil {
		t.Errorf("Stop of a deleted device: %v", err)
	}
}

// growingFile is an image file whose size the queue may ask again.
type growingFile struct{ fileBackend }

func (g growingFile) Restat() (int64, error) {
	fi, err := g.Stat()
	if err != nil {
		return 0, err
	}
	return fi.Size(), nil
}
