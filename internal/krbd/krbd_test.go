package krbd

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// fakeBus is a bus folder with the files the kernel has; devices are made
// by the test.
func fakeBus(t *testing.T) Bus {
	t.Helper()
	root := filepath.Join(t.TempDir(), "rbd")
	if err := os.MkdirAll(filepath.Join(root, "devices"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"add_single_major", "remove_single_major"} {
		if err := os.WriteFile(filepath.Join(root, f), nil, 0o200); err != nil {
			t.Fatal(err)
		}
	}
	return Bus{Root: root, Dev: "/dev"}
}

func addDevice(t *testing.T, b Bus, id, pool, image, snap, client string) {
	t.Helper()
	dir := filepath.Join(b.Root, "devices", id)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, v := range map[string]string{"pool": pool, "name": image, "current_snap": snap, "client_addr": client, "size": "1073741824"} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(v+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func TestKernelMonitors(t *testing.T) {
	for _, c := range []struct{ in, addrs, mode string }{
		{"[v2:10.0.0.1:3300]", "10.0.0.1:3300", "prefer-crc"},
		{"[v2:10.0.0.1:3300],[v1:10.0.0.1:6789],[v2:[fd00::1]:3300]", "10.0.0.1:3300,[fd00::1]:3300", "prefer-crc"},
		{"[v1:10.0.0.1:6789],[v1:10.0.0.2:6789]", "10.0.0.1:6789,10.0.0.2:6789", ""},
	} {
		addrs, mode, err := kernelMonitors(c.in)
		if err != nil || addrs != c.addrs || mode != c.mode {
			t.Errorf("kernelMonitors(%q) = %q, %q, %v; want %q, %q", c.in, addrs, mode, err, c.addrs, c.mode)
		}
	}
	for _, bad := range []string{"", "10.0.0.1:3300", "[v3:10.0.0.1:3300]", "[v2:mon.example:3300]", "[v2:10.0.0.1]"} {
		if _, _, err := kernelMonitors(bad); err == nil {
			t.Errorf("kernelMonitors(%q) took it", bad)
		}
	}
}

// The map request: monitors, options (own client, exclusive lock, bounded
// waits), pool, image, no snapshot. A request the kernel's parser would
// split wrongly is refused before it is written.
func TestMapRequest(t *testing.T) {
	b := fakeBus(t)
	s := Spec{Monitors: "[v2:10.0.0.1:3300]", Client: "berth-node", Key: "QUJD+/==", Pool: "berth", Image: "pvc-1", Exclusive: true, Timeout: 20 * time.Second}
	_, err := b.Map(t.Context(), s)
	if err == nil || !strings.Contains(err.Error(), "no new device") || strings.Contains(err.Error(), s.Key) {
		t.Fatalf("Map with no device made: %v", err)
	}
	got, err := os.ReadFile(filepath.Join(b.Root, "add_single_major"))
	if err != nil {
		t.Fatal(err)
	}
	want := "10.0.0.1:3300 name=berth-node,secret=QUJD+/==,ms_mode=prefer-crc,mount_timeout=20,noshare,exclusive,lock_timeout=20 berth pvc-1 -"
	if string(got) != want {
		t.Errorf("map request\n%s\nwant\n%s", got, want)
	}
	s.Exclusive = false
	if s.options("prefer-crc") != "name=berth-node,secret=QUJD+/==,ms_mode=prefer-crc,mount_timeout=20,noshare" {
		t.Errorf("options without exclusive %s", s.options("prefer-crc"))
	}
	s.ReadOnly = true
	if s.options("") != "name=berth-node,secret=QUJD+/==,mount_timeout=20,noshare,read_only" {
		t.Errorf("read-only msgr1 options %s", s.options(""))
	}
	for _, bad := range []Spec{
		{Monitors: s.Monitors, Client: "a,b", Key: "k", Pool: "p", Image: "i"},
		{Monitors: s.Monitors, Client: "a", Key: "k k", Pool: "p", Image: "i"},
		{Monitors: s.Monitors, Client: "a", Key: "k", Pool: "p", Image: "i j"},
		{Monitors: s.Monitors, Client: "a", Key: "k", Pool: "p/q", Image: "i"},
		{Monitors: s.Monitors, Client: "a", Key: "", Pool: "p", Image: "i"},
	} {
		if err := os.WriteFile(filepath.Join(b.Root, "add_single_major"), nil, 0o200); err != nil {
			t.Fatal(err)
		}
		if _, err := b.Map(t.Context(), bad); err == nil {
			t.Errorf("Map(%+v) took it", bad)
		}
		if got, _ := os.ReadFile(filepath.Join(b.Root, "add_single_major")); len(got) != 0 {
			t.Errorf("Map(%+v) wrote %q", bad, got)
		}
	}
}

func TestListFindAndClientAddr(t *testing.T) {
	b := fakeBus(t)
	addDevice(t, b, "0", "berth", "pvc-1", "-", "10.0.0.5:0/123456")
	addDevice(t, b, "1", "berth", "pvc-1", "snap-1", "10.0.0.5:0/7")
	addDevice(t, b, "2", "other", "pvc-1", "-", "10.0.0.5:0/8")
	addDevice(t, b, "x", "berth", "pvc-1", "-", "10.0.0.5:0/9")
	ds, err := b.Find("berth", "pvc-1")
	if err != nil || len(ds) != 1 || ds[0].ID != 0 || b.Path(ds[0]) != "/dev/rbd0" {
		t.Fatalf("Find = %+v, %v; want rbd0 only", ds, err)
	}
	if addr, err := b.ClientAddr(ds[0]); err != nil || addr != "10.0.0.5:0/123456" {
		t.Errorf("ClientAddr = %q, %v", addr, err)
	}
	if _, ok, err := b.Get(2, "berth", "pvc-1"); ok || err != nil {
		t.Errorf("Get(2) of another pool's image: %t, %v", ok, err)
	}
	if _, ok, err := b.Get(7, "berth", "pvc-1"); ok || err != nil {
		t.Errorf("Get of a device that is not there: %t, %v", ok, err)
	}
	addDevice(t, b, "3", "berth", "pvc-3", "-", "client.4")
	if _, err := b.ClientAddr(Device{ID: 3}); err == nil {
		t.Error("ClientAddr took a word for an address")
	}
}

func TestUnmapWritesTheID(t *testing.T) {
	b := fakeBus(t)
	if err := b.Unmap(t.Context(), Device{ID: 4, Pool: "berth", Image: "pvc-4"}); err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(filepath.Join(b.Root, "remove_single_major")); string(got) != "4" {
		t.Errorf("remove request %q, want 4", got)
	}
}

func TestMapCause(t *testing.T) {
	for errno, want := range map[syscall.Errno]error{
		syscall.EROFS: ErrLocked, syscall.EBUSY: ErrLocked, syscall.EACCES: ErrRefused,
		syscall.ETIMEDOUT: ErrUnreachable, syscall.ENOENT: ErrNoImage,
	} {
		err := mapCause(&os.PathError{Op: "write", Path: "add", Err: errno})
		if !errors.Is(err, want) || !errors.Is(err, errno) {
			t.Errorf("%v: %v, want %v", errno, err, want)
		}
	}
}

func TestAvailable(t *testing.T) {
	if err := (Bus{Root: filepath.Join(t.TempDir(), "none")}).Available(); !errors.Is(err, ErrNoDriver) {
		t.Errorf("Available without the bus: %v", err)
	}
	if err := fakeBus(t).Available(); err != nil {
		t.Errorf("Available: %v", err)
	}
}

// A map the kernel does not answer in time returns when ctx ends.
func TestMapWaitsAtMostCtx(t *testing.T) {
	b := fakeBus(t)
	fifo := filepath.Join(b.Root, "add_single_major")
	_ = os.Remove(fifo)
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Skipf("no FIFO here: %v", err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
	defer cancel()
	_, err := b.Map(ctx, Spec{Monitors: "[v2:10.0.0.1:3300]", Client: "c", Key: "k", Pool: "p", Image: "i"})
	if !errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, ErrPending) {
		t.Fatalf("Map with no answer: %v", err)
	}
	// Let the writer go: open the FIFO for reading once.
	if f, err := os.OpenFile(fifo, os.O_RDONLY|syscall.O_NONBLOCK, 0); err == nil {
		_ = f.Close()
	}
}

func TestID(t *testing.T) {
	b := Bus{}
	for path, want := range map[string]int{"/dev/rbd0": 0, "/dev/rbd12": 12} {
		if id, ok := b.ID(path); !ok || id != want {
			t.Errorf("ID(%q) = %d, %t", path, id, ok)
		}
	}
	for _, path := range []string{"", "/dev/rbd", "/dev/rbd01", "/dev/rbd-1", "/dev/rbd1p1", "/dev/nbd1", "/tmp/dev/rbd1"} {
		if id, ok := b.ID(path); ok {
			t.Errorf("ID(%q) = %d, want none", path, id)
		}
	}
}

// The read-only flag is the block device's; anything but 0 or 1 is an
// error, not a guess.
func TestReadOnly(t *testing.T) {
	b := fakeBus(t)
	b.Block = filepath.Join(filepath.Dir(b.Root), "block")
	d := Device{ID: 7, Pool: "rbd", Image: "a"}
	if _, err := b.ReadOnly(d); err == nil {
		t.Error("ReadOnly of a device with no block folder took it")
	}
	if err := os.MkdirAll(filepath.Join(b.Block, "rbd7"), 0o755); err != nil {
		t.Fatal(err)
	}
	for v, want := range map[string]bool{"0\n": false, "1\n": true} {
		if err := os.WriteFile(filepath.Join(b.Block, "rbd7", "ro"), []byte(v), 0o644); err != nil {
			t.Fatal(err)
		}
		if ro, err := b.ReadOnly(d); err != nil || ro != want {
			t.Errorf("ReadOnly with ro %q = %t, %v; want %t", v, ro, err, want)
		}
	}
	if err := os.WriteFile(filepath.Join(b.Block, "rbd7", "ro"), []byte("x\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := b.ReadOnly(d); err == nil {
		t.Error("ReadOnly with ro \"x\" took it")
	}
}
