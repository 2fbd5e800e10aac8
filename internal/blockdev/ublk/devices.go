package ublk

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// Devices are this node's ublk devices as the node agent needs them to
// stage, heal, grow and unstage volumes served over ublk (agent.Ublk).
// Each call opens the control device: the calls are rare, and the agent
// then holds no ring between them.
type Devices struct {
	cfg ControlConfig
}

// NewDevices returns the devices of the control device cfg names.
func NewDevices(cfg ControlConfig) *Devices { return &Devices{cfg: cfg} }

// Probe tells whether this kernel can serve ublk devices with user
// recovery: nil, or an error of ErrNoUblk or ErrNoRecovery that names the
// missing kernel feature.
func (d *Devices) Probe() error {
	_, err := Probe(d.cfg)
	return err
}

// gone tells that err means the kernel has no such device, or no ublk
// driver at all (so no device either).
func gone(err error) bool {
	return errors.Is(err, unix.ENODEV) || errors.Is(err, ErrNoUblk)
}

// do runs f on a control client; a kernel without ublk runs nothing and
// answers ErrNoUblk.
func (d *Devices) do(f func(c *Control) error) error {
	c, err := OpenControl(d.cfg)
	if err != nil {
		return err
	}
	return errors.Join(f(c), c.Close())
}

// Device returns device id as the kernel has it: its state and the flags
// it was granted. found is false when the kernel has none (deleted, or the
// node rebooted).
func (d *Devices) Device(id uint32) (info DevInfo, found bool, err error) {
	err = d.do(func(c *Control) (err error) { info, err = c.DeviceInfo(id); return err })
	if gone(err) {
		return DevInfo{}, false, nil
	}
	return info, err == nil, err
}

// Find returns the device marked tag (Tag): the one a server added for a
// volume whose record lost its number. found is false when there is none.
func (d *Devices) Find(tag uint64) (info DevInfo, found bool, err error) {
	entries, err := os.ReadDir(d.cfg.dev())
	if err != nil {
		return DevInfo{}, false, fmt.Errorf("ublk: list devices: %w", err)
	}
	var ids []uint32
	for _, e := range entries {
		if n, ok := strings.CutPrefix(e.Name(), "ublkc"); ok {
			if id, err := strconv.ParseUint(n, 10, 32); err == nil {
				ids = append(ids, uint32(id))
			}
		}
	}
	if len(ids) == 0 {
		return DevInfo{}, false, nil
	}
	err = d.do(func(c *Control) error {
		for _, id := range ids {
			i, err := c.DeviceInfo(id)
			if errors.Is(err, unix.ENODEV) {
				continue // deleted meanwhile
			}
			if err != nil {
				return err
			}
			if i.ServerFlags == tag {
				info, found = i, true
				return nil
			}
		}
		return nil
	})
	if gone(err) {
		return DevInfo{}, false, nil
	}
	return info, found, err
}

// Stop removes device id's block device (STOP_DEV): its server's queue
// ends. Nil when the kernel has no such device.
func (d *Devices) Stop(id uint32) error {
	if err := d.do(func(c *Control) error { return c.StopDevice(id) }); err != nil && !gone(err) {
		return err
	}
	return nil
}

// Delete deletes device id (DEL_DEV) once its server has closed the char
// device. Nil when the kernel has no such device.
func (d *Devices) Delete(id uint32) error {
	if err := d.do(func(c *Control) error { return c.DeleteDevice(id) }); err != nil && !gone(err) {
		return err
	}
	return nil
}

// ErrNoUpdateSize means that the device cannot change its size while it
// runs (a driver before UBLK_F_UPDATE_SIZE, Linux 6.16, or a device added
// without it).
var ErrNoUpdateSize = errors.New("the kernel's ublk driver cannot resize a running device (UBLK_F_UPDATE_SIZE, Linux 6.16)")

// UpdateSize sets running device id's size to size bytes, rounded down to
// whole 4 KiB blocks; ErrNoUpdateSize where the device cannot.
func (d *Devices) UpdateSize(id uint32, size int64) error {
	return d.do(func(c *Control) error {
		info, err := c.DeviceInfo(id)
		if err != nil {
			return err
		}
		if info.Flags&FlagUpdateSize == 0 {
			return fmt.Errorf("ublk device %d (flags %#x): %w", id, info.Flags, ErrNoUpdateSize)
		}
		return c.UpdateSize(id, size&^4095)
	})
}
