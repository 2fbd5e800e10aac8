package agent

import (
	"context"
	"fmt"

	v1 "github.com/berth-io/berth/api/v1alpha1"
)

// Transport is how a staged volume's block device reaches the kernel on
// this node. It is chosen once, when the volume is staged, and kept in the
// volume's record (device_record.go) until it is unstaged.
type Transport string

// The transports, one implementation of device each.
const (
	// TransportLoop: a loop device on the image file (mounter kernel).
	TransportLoop Transport = "loop"
	// TransportFUSE: a blockdev server serves the image as a file over a
	// FUSE connection the keeper holds; a loop device on that file.
	TransportFUSE = Transport(v1.TransportFUSE)
	// TransportNBD: a blockdev server serves the image over the kernel's nbd.
	TransportNBD = Transport(v1.TransportNBD)
	// TransportUblk: a blockdev server serves the image over the kernel's
	// ublk, with user recovery.
	TransportUblk = Transport(v1.TransportUblk)
	// TransportAuto is no transport of its own: a stage picks ublk where
	// the kernel serves it with user recovery, else fuse (autoTransport).
	TransportAuto = Transport(v1.TransportAuto)
)

// ParseTransport checks the name of a userspace transport; "" is fuse.
func ParseTransport(s string) (Transport, error) {
	switch Transport(s) {
	case "", TransportFUSE:
		return TransportFUSE, nil
	case TransportNBD, TransportUblk, TransportAuto:
		return Transport(s), nil
	}
	return "", fmt.Errorf("unknown userspace transport %q (want %s, %s, %s or %s)", s, TransportAuto, TransportFUSE, TransportNBD, TransportUblk)
}

// device is one transport's way of giving a volume its block device on this
// node. Stage, unstage, heal, expand, cleanup and condition call it and
// never ask which transport it is. The caller holds the volume lock, except
// for Serving and Condition.
type device interface {
	// Check refuses, before a stage makes anything, a volume that this
	// node cannot serve this way.
	Check(volume string) error
	// Attach makes the volume's block device, or finds the one an earlier
	// call made. Also on error, the result says what this call made, so
	// that a failed stage undoes that and nothing an earlier stage made.
	Attach(ctx context.Context, r attachRequest) (attachment, error)
	// Find returns the device of a volume staged here ("" when it has
	// none), also for a volume an earlier agent process staged.
	Find(ctx context.Context, volume string) (string, error)
	// Detach frees dev, the volume's device; a no-op where the device
	// goes with the volume's servers (Stop).
	Detach(ctx context.Context, volume, dev string) error
	// Stop ends the volume's servers and its kernel connection. The
	// device is detached. Idempotent.
	Stop(ctx context.Context, volume string) error
	// Serving tells, without the volume lock and without waiting on a
	// server, a heal's result when it is known already (ok): a live server,
	// or nothing to heal.
	Serving(ctx context.Context, volume string) (res HealResult, ok bool)
	// Heal starts a server for a staged volume whose server is gone;
	// image is called only when one must start. It returns ErrKeeperDown
	// or ErrConnectionLost when the volume's kernel side is gone, so that
	// nothing can serve it any more.
	Heal(ctx context.Context, volume string, image func(context.Context) (string, error)) (HealResult, error)
	// Expand makes the device take its image's new size; it returns the
	// device.
	Expand(ctx context.Context, volume string) (dev string, err error)
	// Condition tells whether the volume's device and servers are healthy.
	Condition(ctx context.Context, volume string) (abnormal bool, msg string)
}

// attachRequest asks for a volume's device.
type attachRequest struct {
	Volume   string
	Image    string
	ReadOnly bool
	// Cluster is the volume's StorageCluster (nil when it has no object);
	// Secrets the stage request's (a ceph volume's cephx client).
	Cluster *v1.StorageCluster
	Secrets map[string]string
}

// attachment is what one Attach call made.
type attachment struct {
	// Device is the block device ("" when the call failed before it).
	Device string
	// NewDevice: the device did not exist before this call (Detach undoes
	// it; Find finds it when Device is "").
	NewDevice bool
	// NewConnection: the volume's servers and kernel connection did not
	// exist before this call (Stop undoes them).
	NewConnection bool
	// Pending: the call failed without knowing whether the kernel made
	// the device, which it may still do. The record stays, so that the
	// next stage or unstage of the volume finds the device by it.
	Pending bool
}

// transports are this agent's devices by the transport a record names. A
// new transport is one file implementing device and one line here.
func (a *Agent) transports() map[Transport]device {
	t := map[Transport]device{
		TransportLoop: loopDevice{loop: a.loop, image: a.imagePath},
		TransportKRBD: krbdDevice{bus: a.rbd, records: a.records()},
	}
	if a.us != nil {
		us := userspace{cfg: a.us, procs: &a.procs, records: a.records(), node: a.node, log: a.log, netns: a.netns}
		t[TransportFUSE] = fuseDevice{userspace: us, loop: a.loop}
		t[TransportNBD] = nbdDevice{userspace: us}
		t[TransportUblk] = ublkDevice{userspace: us, imageSize: a.imageSize}
		t[TransportRBD] = rbdDevice{userspace: us, fuse: t[TransportFUSE], nbd: t[TransportNBD], ublk: t[TransportUblk],
			via: a.userspaceTransport}
	}
	return t
}

// chooseTransport is how a new stage of vol reaches the kernel: a kernel
// volume through a loop device (krbd for ceph); a userspace one as its
// StorageCluster says (the agent serves every cluster, each with its own
// choice), else as the agent is set to (through librbd for ceph).
func (a *Agent) chooseTransport(vol *v1.Volume, sc *v1.StorageCluster) Transport {
	if sc != nil && sc.Spec.Backend == v1.BackendCeph {
		return cephTransport(vol)
	}
	if vol.Spec.Mounter != v1.MounterUserspace {
		return TransportLoop
	}
	return a.userspaceTransport(sc)
}

// userspaceTransport is how sc's new userspace volumes reach the kernel.
func (a *Agent) userspaceTransport(sc *v1.StorageCluster) Transport {
	t := TransportFUSE
	switch {
	case sc != nil && sc.Spec.Agent.UserspaceTransport != "":
		t = Transport(sc.Spec.Agent.UserspaceTransport)
	case a.us != nil && a.us.Transport != "":
		t = a.us.Transport
	}
	if t == TransportAuto {
		return a.autoTransport()
	}
	return t
}

// autoTransport is ublk where this node's kernel serves ublk with user
// recovery (the kernel keeps the device and its I/O while a new server
// takes over, with no keeper between), else fuse, which every kernel with
// FUSE serves.
func (a *Agent) autoTransport() Transport {
	if a.us != nil && a.us.Ublk != nil && a.us.Ublk.Probe() == nil {
		return TransportUblk
	}
	return TransportFUSE
}

// deviceFor returns the device of transport t.
func (a *Agent) deviceFor(volume string, t Transport) (device, error) {
	d, ok := a.transports()[t]
	if !ok {
		return nil, fmt.Errorf("volume %s: transport %s: %w on this agent", volume, t, ErrUnsupported)
	}
	return d, nil
}

// device returns the device of a volume as its record says; a volume with
// no record is on a loop device (or not staged here at all).
func (a *Agent) device(volume string) (device, error) {
	rec, _, err := a.records().load(volume)
	if err != nil {
		return nil, err
	}
	return a.deviceFor(volume, rec.Transport)
}

// stagedTransport is the transport of a volume staged here, else the one a
// stage would choose; for metrics, which must not fail.
func (a *Agent) stagedTransport(vol *v1.Volume) Transport {
	if rec, found, err := a.records().load(vol.Name); err == nil && found {
		return rec.Transport
	}
	return a.chooseTransport(vol, nil)
}

// stopDevice ends the volume's servers and connection, then drops its
// record and server log: the record goes last, so that a retry after a
// crash still knows the transport.
func (a *Agent) stopDevice(ctx context.Context, volume string, d device) error {
	if err := d.Stop(ctx, volume); err != nil {
		return err
	}
	return a.records().remove(volume)
}
