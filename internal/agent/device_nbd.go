package agent

import (
	"context"
	"fmt"

	"github.com/berth-io/berth/internal/blockdev/launch"
)

// NBD is the kernel nbd driver as the agent needs it (internal/nbd).
type NBD interface {
	// Available tells whether this kernel has nbd, and why not.
	Available() (ok bool, reason string)
	// Device returns the nbd device made for volume; found false when the
	// kernel has none (never connected, disconnected, or the node rebooted).
	// The kernel keeps a device whose server died, past the dead-connection
	// timeout too, until it is disconnected.
	Device(volume string) (dev string, found bool, err error)
	// Disconnect removes the volume's device; nil when it has none.
	Disconnect(volume string) error
}

// ErrNBDUnavailable means that the agent is set to serve userspace volumes
// over nbd and this node's kernel has no nbd driver.
var ErrNBDUnavailable = fmt.Errorf("userspace transport nbd: %w on this node", ErrUnsupported)

func nbdUnavailable(volume, reason string) error {
	return fmt.Errorf("volume %s: %w: %s; or set the agent's userspace transport to %s", volume, ErrNBDUnavailable, reason, TransportFUSE)
}

// nbdDevice is an nbd device that a blockdev server connects to the
// kernel; the kernel keeps it (and queues its I/O) while the server
// restarts, and it goes when it is disconnected.
type nbdDevice struct {
	userspace
}

func (n nbdDevice) Check(volume string) error {
	if ok, reason := n.cfg.NBD.Available(); !ok {
		return nbdUnavailable(volume, reason)
	}
	return nil
}

func (n nbdDevice) Attach(ctx context.Context, r attachRequest) (attachment, error) {
	_, had, err := n.cfg.NBD.Device(r.Volume)
	if err != nil {
		return attachment{}, fmt.Errorf("find nbd device of %s: %w", r.Volume, err)
	}
	// The device goes with its server (Stop): it is a new connection.
	att := attachment{NewConnection: !had}
	if _, err := n.ensureServer(ctx, r.Volume, r.Image); err != nil {
		return att, err
	}
	if att.Device, err = n.device(r.Volume); err != nil {
		return att, err
	}
	return att, nil
}

func (n nbdDevice) Find(_ context.Context, volume string) (string, error) {
	dev, found, err := n.cfg.NBD.Device(volume)
	if err != nil || !found {
		return "", err
	}
	return dev, nil
}

// Detach does nothing: the device goes with its server (Stop).
func (nbdDevice) Detach(context.Context, string, string) error { return nil }

// Stop disconnects the volume's device, stops its server (which the
// disconnect usually ends already). Idempotent.
func (n nbdDevice) Stop(_ context.Context, volume string) error {
	if err := n.cfg.NBD.Disconnect(volume); err != nil {
		return fmt.Errorf("disconnect nbd device of %s: %w", volume, err)
	}
	return n.stopServer(volume, TransportNBD)
}

func (n nbdDevice) Serving(_ context.Context, volume string) (HealResult, bool) {
	if _, found, err := n.server(volume); err == nil && found {
		return HealServing, true
	}
	return "", false
}

// Heal starts a server that reconnects the device the kernel kept.
func (n nbdDevice) Heal(ctx context.Context, volume string, image func(context.Context) (string, error)) (HealResult, error) {
	// Without its device a new server would connect a new, empty one.
	if _, err := n.device(volume); err != nil {
		return HealSkipped, err
	}
	if _, found, err := n.server(volume); err != nil {
		return HealSkipped, err
	} else if found {
		return HealServing, nil
	}
	return restartServer(ctx, volume, image, n.startServer)
}

// Expand is refused: the kernel sets an nbd device's size at connect only.
func (nbdDevice) Expand(_ context.Context, volume string) (string, error) {
	return "", fmt.Errorf("volume %s is served over nbd, whose size the kernel fixes at connect: "+
		"online expansion is %w; the new size applies when the volume is staged again", volume, ErrUnsupported)
}

// Condition checks the volume's server and device.
func (n nbdDevice) Condition(_ context.Context, volume string) (abnormal bool, msg string) {
	if _, found, err := n.cfg.NBD.Device(volume); err != nil {
		return true, fmt.Sprintf("cannot find this volume's nbd device: %v", err)
	} else if !found {
		return true, "the kernel no longer has this volume's nbd device: its I/O fails; restart the pods using this volume so that it is staged anew"
	}
	if _, found, err := n.server(volume); err != nil {
		return true, err.Error()
	} else if !found {
		return true, "no blockdev server is connected to this volume's nbd device: its I/O waits for the " +
			"dead-connection timeout at most, then fails until the agent's healer starts one"
	}
	return false, ""
}

// server finds the volume's running nbd server (userspace.findServer).
func (n nbdDevice) server(volume string) (pid int, found bool, err error) {
	return n.findServer(volume, TransportNBD)
}

// ensureServer makes sure a server serves volume's nbd device, starting
// one when none runs (started): it connects a new device, or reconnects
// the one the kernel kept.
func (n nbdDevice) ensureServer(ctx context.Context, volume, image string) (started bool, err error) {
	if _, found, err := n.server(volume); err != nil || found {
		return false, err
	}
	return true, n.startServer(ctx, volume, image)
}

// startServer starts a server and records its pid.
func (n nbdDevice) startServer(ctx context.Context, volume, image string) error {
	if err := n.Check(volume); err != nil {
		return err
	}
	proc, err := n.start(ctx, launch.Params{
		Node: n.node, Volume: volume, Image: image, Transport: string(TransportNBD), DeadConnTimeout: n.cfg.DeadConnTimeout,
	})
	if err != nil {
		return err
	}
	rec := volumeRecord{Transport: TransportNBD, ServerPID: proc.PID()}
	if cur, found, err := n.records.load(volume); err == nil && found && cur.Transport == TransportRBD {
		// An RBD image over nbd stays one.
		cur.ServerPID = proc.PID()
		rec = cur
	}
	if err := n.records.save(volume, rec); err != nil {
		// The server is found by its command line all the same.
		n.log.Error(err, "record nbd server pid", "volume", volume, "pid", proc.PID())
	}
	return nil
}

// device is the block device of a volume served over nbd.
func (n nbdDevice) device(volume string) (string, error) {
	dev, found, err := n.cfg.NBD.Device(volume)
	if err != nil {
		return "", fmt.Errorf("find nbd device of %s: %w", volume, err)
	}
	if !found {
		return "", fmt.Errorf("volume %s: the kernel has no nbd device for it (disconnected, or the node rebooted): %w",
			volume, ErrConnectionLost)
	}
	return dev, nil
}
