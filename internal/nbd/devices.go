package nbd

import (
	"fmt"
)

// Devices finds and removes volumes' nbd devices by their backend
// identifier: what the node agent needs to stage, heal and unstage volumes
// served over nbd (agent.NBD).
type Devices struct {
	kernel Kernel
	sysfs  string
	node   string
}

// NewDevices returns node's devices of kernel, found under sysfs ("/sys"):
// those whose servers were started with node (RunConfig.Node).
func NewDevices(kernel Kernel, sysfs, node string) *Devices {
	return &Devices{kernel: kernel, sysfs: sysfs, node: node}
}

// Available tells whether this kernel has nbd, and why not.
func (d *Devices) Available() (bool, string) { return Available(d.sysfs) }

// Device returns the device node of volume's nbd device.
func (d *Devices) Device(volume string) (string, bool, error) {
	idx, found, err := FindByBackend(d.sysfs, BackendID(d.node, volume))
	if err != nil || !found {
		return "", false, err
	}
	return DevicePath(idx), true, nil
}

// Disconnect removes volume's nbd device; the kernel ends its server's
// connections. Nil when the volume has no device (already disconnected).
func (d *Devices) Disconnect(volume string) error {
	if ok, _ := d.Available(); !ok {
		return nil // no nbd driver: no device to remove
	}
	idx, found, err := FindByBackend(d.sysfs, BackendID(d.node, volume))
	if err != nil || !found {
		return err
	}
	if err := d.kernel.Disconnect(idx); err != nil {
		return fmt.Errorf("disconnect %s: %w", DevicePath(idx), err)
	}
	return nil
}
