package nbd

import (
	"os"
	"path/filepath"
	"testing"
	"time"
)

func TestDevicesFindAndDisconnect(t *testing.T) {
	k := newFakeKernelDriver(t)
	if err := os.MkdirAll(filepath.Join(k.sysfs, "module", "nbd"), 0o755); err != nil {
		t.Fatal(err)
	}
	devs := NewDevices(k, k.sysfs)
	if ok, reason := devs.Available(); !ok {
		t.Fatalf("Available: %s", reason)
	}
	if dev, found, err := devs.Device("vol-1"); err != nil || found {
		t.Fatalf("before connect: Device = %q, %t, %v", dev, found, err)
	}
	if err := devs.Disconnect("vol-1"); err != nil {
		t.Fatalf("Disconnect of a volume without a device: %v", err)
	}

	_, image := newImage(t, 8<<20, false)
	r := startRun(t, k, image, nil)
	if dev := r.waitReady(t); dev != "/dev/nbd0" {
		t.Fatalf("device %q", dev)
	}
	if dev, found, err := devs.Device("vol-1"); err != nil || !found || dev != "/dev/nbd0" {
		t.Fatalf("Device = %q, %t, %v; want /dev/nbd0", dev, found, err)
	}
	if err := devs.Disconnect("vol-1"); err != nil {
		t.Fatal(err)
	}
	// The kernel's disconnect ends the server.
	select {
	case err := <-r.done:
		r.done <- err // for startRun's cleanup
		if err != nil {
			t.Fatalf("Run after disconnect: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("server still running after its device was disconnected")
	}
	if _, found, err := devs.Device("vol-1"); err != nil || found {
		t.Fatalf("after disconnect: found %t, %v", found, err)
	}
}

func TestDevicesWithoutDriver(t *testing.T) {
	devs := NewDevices(newFakeKernelDriver(t), t.TempDir())
	if ok, reason := devs.Available(); ok || reason == "" {
		t.Fatalf("Available = %t %q on a kernel without nbd", ok, reason)
	}
	if err := devs.Disconnect("vol-1"); err != nil {
		t.Fatalf("Disconnect without a driver: %v", err)
	}
}
