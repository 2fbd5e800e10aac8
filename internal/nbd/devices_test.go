package nbd

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/berth-io/berth/internal/blockdev/blockdevtest"
)

func TestDevicesFindAndDisconnect(t *testing.T) {
	k := newFakeKernelDriver(t)
	if err := os.MkdirAll(filepath.Join(k.sysfs, "module", "nbd"), 0o755); err != nil {
		t.Fatal(err)
	}
	devs := NewDevices(k, k.sysfs, "")
	if ok, reason := devs.Available(); !ok {
		t.Fatalf("Available: %s", reason)
	}
	if dev, found, err := devs.Device("vol-1"); err != nil || found {
		t.Fatalf("before connect: Device = %q, %t, %v", dev, found, err)
	}
	if err := devs.Disconnect("vol-1"); err != nil {
		t.Fatalf("Disconnect of a volume without a device: %v", err)
	}

	_, image := blockdevtest.ImageFile(t, 8<<20, false)
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
	if err := r.ended(t, "server still running after its device was disconnected"); err != nil {
		t.Fatalf("Run after disconnect: %v", err)
	}
	if _, found, err := devs.Device("vol-1"); err != nil || found {
		t.Fatalf("after disconnect: found %t, %v", found, err)
	}
}

func TestDevicesWithoutDriver(t *testing.T) {
	devs := NewDevices(newFakeKernelDriver(t), t.TempDir(), "n1")
	if ok, reason := devs.Available(); ok || reason == "" {
		t.Fatalf("Available = %t %q on a kernel without nbd", ok, reason)
	}
	if err := devs.Disconnect("vol-1"); err != nil {
		t.Fatalf("Disconnect without a driver: %v", err)
	}
}

// Two nodes sharing one kernel (nodes in namespaces or containers of one
// machine) each serve the same volume: each node's Devices finds and
// disconnects only its own device, never the other node's.
func TestDevicesOfNodesSharingAKernel(t *testing.T) {
	k := newFakeKernelDriver(t)
	if err := os.MkdirAll(filepath.Join(k.sysfs, "module", "nbd"), 0o755); err != nil {
		t.Fatal(err)
	}
	_, imageA := blockdevtest.ImageFile(t, 8<<20, false)
	_, imageB := blockdevtest.ImageFile(t, 8<<20, false)
	ra := startRun(t, k, imageA, func(c *RunConfig) { c.Node = "node-a" })
	devA := ra.waitReady(t)
	rb := startRun(t, k, imageB, func(c *RunConfig) { c.Node = "node-b" })
	devB := rb.waitReady(t)
	if devA == devB {
		t.Fatalf("node b's server took node a's device %s", devA)
	}
	a, b := NewDevices(k, k.sysfs, "node-a"), NewDevices(k, k.sysfs, "node-b")
	if dev, found, err := b.Device("vol-1"); err != nil || !found || dev != devB {
		t.Fatalf("node b's Device = %q, %t, %v; want %s", dev, found, err, devB)
	}
	if err := b.Disconnect("vol-1"); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-ra.done:
		ra.done <- err
		t.Fatalf("node a's server ended (%v) when node b disconnected its device", err)
	case err := <-rb.done:
		rb.done <- err
	case <-time.After(10 * time.Second):
		t.Fatal("node b's server still running after its device was disconnected")
	}
	if dev, found, err := a.Device("vol-1"); err != nil || !found || dev != devA {
		t.Fatalf("node a's Device after node b's disconnect = %q, %t, %v; want %s", dev, found, err, devA)
	}
}
