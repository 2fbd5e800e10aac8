package agent

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
)

// TransportKRBD: the kernel's rbd driver maps a ceph volume's RBD image
// (mounter kernel).
const TransportKRBD Transport = "krbd"

// krbdDevice is a ceph volume with mounter kernel. Mapping through krbd
// is not built yet: Check refuses every stage before anything is made,
// naming the module when the kernel lacks it (as here). The other methods
// find nothing, as no volume is ever staged this way.
type krbdDevice struct {
	// sysfs is where the rbd bus is looked up ("" is /sys).
	sysfs string
}

func (k krbdDevice) Check(volume string) error {
	sysfs := k.sysfs
	if sysfs == "" {
		sysfs = "/sys"
	}
	bus := filepath.Join(sysfs, "bus", "rbd")
	if _, err := os.Stat(bus); errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("volume %s is a ceph volume with mounter kernel, which maps its RBD image with the kernel's rbd driver (krbd), "+
			"but this node's kernel has no rbd module (%s is missing; modprobe rbd, or use a StorageClass with mounter userspace, "+
			"which serves the image through librbd): %w", volume, bus, ErrUnsupported)
	} else if err != nil {
		return fmt.Errorf("volume %s: look for the kernel's rbd driver: %w", volume, err)
	}
	return fmt.Errorf("volume %s is a ceph volume with mounter kernel: mapping RBD images with krbd is not built into this agent yet; "+
		"use a StorageClass with mounter userspace, which serves the image through librbd: %w", volume, ErrUnsupported)
}

func (krbdDevice) Attach(_ context.Context, r attachRequest) (attachment, error) {
	return attachment{}, krbdDevice{}.Check(r.Volume)
}

func (krbdDevice) Find(context.Context, string) (string, error)       { return "", nil }
func (krbdDevice) Detach(context.Context, string, string) error       { return nil }
func (krbdDevice) Stop(context.Context, string) error                 { return nil }
func (krbdDevice) Serving(context.Context, string) (HealResult, bool) { return HealSkipped, true }
func (krbdDevice) Condition(context.Context, string) (bool, string)   { return false, "" }
func (krbdDevice) Heal(context.Context, string, func(context.Context) (string, error)) (HealResult, error) {
	return HealSkipped, nil
}

func (krbdDevice) Expand(_ context.Context, volume string) (string, error) {
	return "", fmt.Errorf("volume %s: %w", volume, ErrNotStaged)
}
