package ublk

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
)

// TestDevicesWithoutUblk: on a kernel without ublk (this machine's) there
// is no device to find, stop or delete, and the probe names what is
// missing.
func TestDevicesWithoutUblk(t *testing.T) {
	d := NewDevices(ControlConfig{Dev: t.TempDir()})
	if err := d.Probe(); !errors.Is(err, ErrNoUblk) {
		t.Errorf("Probe = %v, want ErrNoUblk", err)
	}
	if _, found, err := d.Device(3); found || err != nil {
		t.Errorf("Device = %t, %v; want none", found, err)
	}
	if err := d.Stop(3); err != nil {
		t.Errorf("Stop = %v", err)
	}
	if err := d.Delete(3); err != nil {
		t.Errorf("Delete = %v", err)
	}
	if err := d.UpdateSize(3, 1<<30); !errors.Is(err, ErrNoUblk) {
		t.Errorf("UpdateSize = %v, want ErrNoUblk", err)
	}
}

// TestDevicesFindWithoutUblk: no char devices, or no control device to
// ask: no device is marked with the tag.
func TestDevicesFindWithoutUblk(t *testing.T) {
	dev := t.TempDir()
	d := NewDevices(ControlConfig{Dev: dev})
	if _, found, err := d.Find(Tag("n", "v")); found || err != nil {
		t.Errorf("Find in an empty /dev = %t, %v", found, err)
	}
	if err := os.WriteFile(filepath.Join(dev, "ublkc3"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, found, err := d.Find(Tag("n", "v")); found || err != nil {
		t.Errorf("Find without a control device = %t, %v", found, err)
	}
}
