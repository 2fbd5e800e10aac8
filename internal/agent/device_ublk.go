package agent

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/berth-io/berth/internal/backend"
	"github.com/berth-io/berth/internal/blockdev/launch"
	"github.com/berth-io/berth/internal/blockdev/ublk"
)

// Ublk is the kernel ublk driver as the agent needs it (ublk.Devices).
type Ublk interface {
	// Probe tells whether this kernel serves ublk devices with user
	// recovery: nil, or an error naming the missing kernel feature.
	Probe() error
	// Device returns device id; found false when the kernel has none.
	Device(id uint32) (info ublk.DevInfo, found bool, err error)
	// Find returns the device marked tag (ublk.Tag); found false when
	// there is none.
	Find(tag uint64) (info ublk.DevInfo, found bool, err error)
	// Stop removes device id's block device, which ends its server; nil
	// when the kernel has no such device.
	Stop(id uint32) error
	// Delete deletes device id once its server is gone; nil when the
	// kernel has no such device.
	Delete(id uint32) error
	// UpdateSize grows running device id to size bytes;
	// ublk.ErrNoUpdateSize where the kernel cannot.
	UpdateSize(id uint32, size int64) error
}

// ErrUblkUnavailable means that a volume is to be served over ublk and this
// node's kernel has no ublk driver, or one without user recovery.
var ErrUblkUnavailable = fmt.Errorf("userspace transport ublk: %w on this node", ErrUnsupported)

// noUblk is the ublk driver of an agent given none.
type noUblk struct{}

func (noUblk) Probe() error {
	return errors.New("the agent was started without a ublk driver")
}
func (noUblk) Device(uint32) (ublk.DevInfo, bool, error) { return ublk.DevInfo{}, false, nil }
func (noUblk) Find(uint64) (ublk.DevInfo, bool, error)   { return ublk.DevInfo{}, false, nil }
func (noUblk) Stop(uint32) error                         { return nil }
func (noUblk) Delete(uint32) error                       { return nil }
func (noUblk) UpdateSize(uint32, int64) error            { return ublk.ErrNoUpdateSize }

// ublkDevice is a ublk device that a blockdev server adds and serves. The
// kernel keeps it, and queues its I/O, while no server runs (user
// recovery): a new server takes it over, with no keeper. It goes when it
// is stopped and deleted.
type ublkDevice struct {
	userspace
	// imageSize is the size of the volume's image, which a grown device
	// takes.
	imageSize func(ctx context.Context, volume string) (int64, error)
}

// imageSize is the size of the volume's image.
func (a *Agent) imageSize(ctx context.Context, id string) (int64, error) {
	img, err := a.volumeImages().Get(ctx, id)
	if errors.Is(err, backend.ErrNotFound) {
		return 0, fmt.Errorf("image of volume %s: %w", id, ErrVolumeNotFound)
	}
	if err != nil {
		return 0, fmt.Errorf("image of volume %s: %w", id, err)
	}
	return img.Size, nil
}

// Check refuses, before anything is made, a kernel without ublk or without
// its user recovery, naming the missing feature.
func (u ublkDevice) Check(volume string) error {
	if err := u.cfg.Ublk.Probe(); err != nil {
		return fmt.Errorf("volume %s: %w: %w; or set the userspace transport to %s", volume, ErrUblkUnavailable, err, TransportFUSE)
	}
	return nil
}

func (u ublkDevice) Attach(ctx context.Context, r attachRequest) (attachment, error) {
	info, had, err := u.kernelDevice(r.Volume)
	if err != nil {
		return attachment{}, err
	}
	// The device goes with its server (Stop): it is a new connection.
	att := attachment{NewConnection: !had}
	if _, found, err := u.findServer(r.Volume, TransportUblk); err != nil {
		return att, err
	} else if !found {
		// A device the kernel kept (an earlier stage's, whose server
		// died) is taken over, never replaced.
		var takeOver *uint32
		if had {
			takeOver = &info.DevID
		}
		if err := u.startServer(ctx, r.Volume, r.Image, takeOver); err != nil {
			return att, err
		}
	}
	if att.Device, err = u.device(r.Volume); err != nil {
		return att, err
	}
	return att, nil
}

func (u ublkDevice) Find(_ context.Context, volume string) (string, error) {
	info, found, err := u.kernelDevice(volume)
	if err != nil || !found {
		return "", err
	}
	return ublk.BlockPath("", info.DevID), nil
}

// Detach does nothing: the device goes with its server (Stop).
func (ublkDevice) Detach(context.Context, string, string) error { return nil }

// Stop stops the volume's device, which ends its server, stops the server
// should it still run, and deletes the device, which the kernel does once
// the server is gone. Idempotent.
func (u ublkDevice) Stop(_ context.Context, volume string) error {
	info, found, err := u.kernelDevice(volume)
	if err != nil {
		return err
	}
	if found {
		if err := u.cfg.Ublk.Stop(info.DevID); err != nil {
			return fmt.Errorf("stop ublk device %d of %s: %w", info.DevID, volume, err)
		}
	}
	if err := u.stopServer(volume, TransportUblk); err != nil {
		return err
	}
	if found {
		if err := u.cfg.Ublk.Delete(info.DevID); err != nil {
			return fmt.Errorf("delete ublk device %d of %s: %w", info.DevID, volume, err)
		}
	}
	return nil
}

func (u ublkDevice) Serving(_ context.Context, volume string) (HealResult, bool) {
	if _, found, err := u.findServer(volume, TransportUblk); err == nil && found {
		return HealServing, true
	}
	return "", false
}

// Heal starts a server that recovers the device the kernel kept.
func (u ublkDevice) Heal(ctx context.Context, volume string, image func(context.Context) (string, error)) (HealResult, error) {
	// Without its device a new server would add a new, empty one.
	info, err := u.deviceInfo(volume)
	if err != nil {
		return HealSkipped, err
	}
	if _, found, err := u.findServer(volume, TransportUblk); err != nil {
		return HealSkipped, err
	} else if found {
		return HealServing, nil
	}
	return restartServer(ctx, volume, image, func(ctx context.Context, volume, image string) error {
		return u.startServer(ctx, volume, image, &info.DevID)
	})
}

// Expand grows the device to the image's size where the kernel can resize
// a running ublk device; its server learns the size from the first request
// past the old end.
func (u ublkDevice) Expand(ctx context.Context, volume string) (string, error) {
	info, err := u.deviceInfo(volume)
	if err != nil {
		return "", err
	}
	size, err := u.imageSize(ctx, volume)
	if err != nil {
		return "", err
	}
	if err := u.cfg.Ublk.UpdateSize(info.DevID, size); errors.Is(err, ublk.ErrNoUpdateSize) {
		return "", fmt.Errorf("volume %s is served over ublk, and %w: online expansion is %w here; "+
			"the new size applies when the volume is staged again", volume, err, ErrUnsupported)
	} else if err != nil {
		return "", fmt.Errorf("grow ublk device %d of %s: %w", info.DevID, volume, err)
	}
	return ublk.BlockPath("", info.DevID), nil
}

// Condition checks the volume's server and device.
func (u ublkDevice) Condition(_ context.Context, volume string) (abnormal bool, msg string) {
	if _, found, err := u.kernelDevice(volume); err != nil {
		return true, fmt.Sprintf("cannot find this volume's ublk device: %v", err)
	} else if !found {
		return true, "the kernel no longer has this volume's ublk device: its I/O fails; restart the pods using this volume so that it is staged anew"
	}
	if _, found, err := u.findServer(volume, TransportUblk); err != nil {
		return true, err.Error()
	} else if !found {
		return true, "no blockdev server serves this volume's ublk device: the kernel queues its I/O until the agent's healer starts one"
	}
	return false, ""
}

// kernelDevice finds the volume's ublk device: the one its record names,
// else (a crash between start and record) the one marked with its tag. A
// device counts only while it carries the volume's tag: its number may
// have gone to another volume (a reboot, or another node on this kernel).
func (u ublkDevice) kernelDevice(volume string) (info ublk.DevInfo, found bool, err error) {
	rec, _, err := u.records.load(volume)
	if err != nil {
		return ublk.DevInfo{}, false, err
	}
	tag := ublk.Tag(u.node, volume)
	if rec.UblkDevice != nil {
		info, found, err = u.cfg.Ublk.Device(*rec.UblkDevice)
		if err != nil {
			return ublk.DevInfo{}, false, fmt.Errorf("find ublk device %d of %s: %w", *rec.UblkDevice, volume, err)
		}
		if found && info.ServerFlags == tag {
			return info, true, nil
		}
	}
	info, found, err = u.cfg.Ublk.Find(tag)
	if err != nil {
		return ublk.DevInfo{}, false, fmt.Errorf("find ublk device of %s: %w", volume, err)
	}
	return info, found, nil
}

// deviceInfo is kernelDevice for a volume that must have its device.
func (u ublkDevice) deviceInfo(volume string) (ublk.DevInfo, error) {
	info, found, err := u.kernelDevice(volume)
	if err != nil {
		return ublk.DevInfo{}, err
	}
	if !found {
		return ublk.DevInfo{}, fmt.Errorf("volume %s: the kernel has no ublk device for it (deleted, or the node rebooted): %w",
			volume, ErrConnectionLost)
	}
	return info, nil
}

// device is the block device of a volume served over ublk.
func (u ublkDevice) device(volume string) (string, error) {
	info, err := u.deviceInfo(volume)
	if err != nil {
		return "", err
	}
	return ublk.BlockPath("", info.DevID), nil
}

// startServer starts a server, which takes over device takeOver (nil:
// adds a new device), and records its pid and device.
func (u ublkDevice) startServer(ctx context.Context, volume, image string, takeOver *uint32) error {
	if err := u.Check(volume); err != nil {
		return err
	}
	proc, err := u.start(ctx, launch.Params{
		Node: u.node, Volume: volume, Image: image, Transport: string(TransportUblk), UblkRecover: takeOver,
	})
	if err != nil {
		return err
	}
	id, ok := servedDevice(proc)
	if !ok && takeOver != nil {
		id, ok = *takeOver, true
	}
	rec, found, err := u.records.load(volume)
	if err != nil || !found || rec.Transport != TransportRBD {
		// An RBD image over ublk stays one, and keeps its record's rest.
		rec.Transport = TransportUblk
	}
	rec.ServerPID, rec.UblkDevice = proc.PID(), nil
	if ok {
		rec.UblkDevice = &id
	}
	if err := u.records.save(volume, rec); err != nil {
		// The server is found by its command line, the device by its tag.
		u.log.Error(err, "record ublk server pid and device", "volume", volume, "pid", proc.PID())
	}
	return nil
}

// servedDevice is the number of the ublk device a started server serves,
// as its ready line said (launch.Process.Device).
func servedDevice(s Server) (uint32, bool) {
	d, ok := s.(interface{ Device() string })
	if !ok {
		return 0, false
	}
	n, ok := strings.CutPrefix(d.Device(), "/dev/ublkb")
	if !ok {
		return 0, false
	}
	id, err := strconv.ParseUint(n, 10, 32)
	return uint32(id), err == nil
}
