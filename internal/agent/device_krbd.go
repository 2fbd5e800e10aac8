package agent

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/berth-io/berth/internal/krbd"
	"github.com/berth-io/berth/internal/volerr"
)

// TransportKRBD: the kernel's rbd driver maps a ceph volume's RBD image
// (mounter kernel).
const TransportKRBD Transport = "krbd"

// krbdTimeout bounds the kernel's wait for the monitors and the image's
// lock at map time, and the agent's wait for a map or unmap.
const krbdTimeout = 30 * time.Second

// krbdDevice is a ceph volume with mounter kernel: the kernel's rbd driver
// maps its image, with a Ceph client of its own (noshare). The mapping
// takes the image's lock at its first write and hands it over when asked
// (no krbd option exclusive): the kernel runs no resize or snapshot for
// other clients, so an exclusive mapping would fail the CSI controller's
// online expansion and snapshots of a volume in use (seen: EROFS). A
// second writer is kept off by the Attachment's fence, and a lost node's
// client is blocklisted before its lock is broken, as for userspace
// volumes; unlike theirs, this does not hold when a record is lost.
// The kernel is the only server: nothing is healed. The record names the
// image and the device, so that unstage and the stale-list clean-up find
// them after an agent restart without the stage's secrets.
type krbdDevice struct {
	bus     krbd.Bus
	records records
	// lookup resolves monitor host names (nil: the system resolver).
	lookup func(ctx context.Context, host string) ([]string, error)
}

// Check refuses, before anything is made, on a kernel without the rbd
// driver and on an agent that keeps no records.
func (k krbdDevice) Check(volume string) error {
	if err := k.bus.Available(); err != nil {
		return fmt.Errorf("volume %s is a ceph volume with mounter kernel, which maps its RBD image with the kernel's rbd driver (krbd), "+
			"but this node's kernel has no rbd module (%w), or use a StorageClass with mounter userspace, "+
			"which serves the image through librbd: %w", volume, err, ErrUnsupported)
	}
	if k.records.dir == "" {
		return fmt.Errorf("volume %s: krbd mappings are recorded in the agent's run dir, and this agent has none (no userspace mounter): %w",
			volume, ErrUnsupported)
	}
	return nil
}

// image is the pool and image a record names.
func (rec volumeRecord) image() (pool, image string, ok bool) {
	pool, image, ok = strings.Cut(rec.RBD, "/")
	return pool, image, ok && pool != "" && image != ""
}

// mapped returns the volume's mapping: the recorded device when it still
// maps the recorded image; without a recorded device (an agent stopped
// between the kernel's map and the record) the one mapping of the image.
func (k krbdDevice) mapped(volume string) (krbd.Device, bool, error) {
	rec, _, err := k.records.load(volume)
	if err != nil {
		return krbd.Device{}, false, err
	}
	return k.mappedIn(volume, rec)
}

// mappedIn is mapped with the volume's record read already.
func (k krbdDevice) mappedIn(volume string, rec volumeRecord) (krbd.Device, bool, error) {
	pool, image, ok := rec.image()
	if !ok {
		return krbd.Device{}, false, nil
	}
	if rec.RBDDevice != nil {
		return k.bus.Get(*rec.RBDDevice, pool, image)
	}
	ds, err := k.bus.Find(pool, image)
	switch {
	case err != nil || len(ds) == 0:
		return krbd.Device{}, false, err
	case len(ds) > 1:
		return krbd.Device{}, false, fmt.Errorf("volume %s: the kernel maps its RBD image %s more than once (%v) and its record names "+
			"none of them: unmap the ones no mount uses (/sys/bus/rbd/remove_single_major): %w", volume, rec.RBD, ds, volerr.ErrPrecondition)
	}
	return ds[0], true, nil
}

func (k krbdDevice) Attach(ctx context.Context, req attachRequest) (attachment, error) {
	access, err := cephAccessFor(ctx, req, k.lookup)
	if err != nil {
		return attachment{}, err
	}
	rec, _, err := k.records.load(req.Volume)
	if err != nil {
		return attachment{}, err
	}
	if d, ok, err := k.mappedIn(req.Volume, rec); err != nil {
		return attachment{}, err
	} else if ok {
		same, err := k.sameAccess(ctx, req, d)
		if err != nil {
			return attachment{}, err
		}
		if same {
			return k.reuse(req.Volume, rec, d)
		}
	}
	// The image is recorded before the kernel maps it: an agent that stops
	// in between finds the mapping by it.
	rec.Transport, rec.RBD, rec.RBDDevice = TransportKRBD, access.Pool+"/"+access.Image, nil
	if err := k.records.save(req.Volume, rec); err != nil {
		return attachment{}, err
	}
	ctx, cancel := context.WithTimeout(ctx, krbdTimeout+5*time.Second)
	defer cancel()
	d, err := k.bus.Map(ctx, krbd.Spec{Monitors: access.MonHost, Client: access.Client, Key: access.Key,
		Pool: access.Pool, Image: access.Image, ReadOnly: req.ReadOnly, Timeout: krbdTimeout})
	if err != nil {
		return attachment{Pending: errors.Is(err, krbd.ErrPending)}, fmt.Errorf("volume %s: %w", req.Volume, krbdCause(err))
	}
	att := attachment{Device: k.bus.Path(d), NewDevice: true, NewConnection: true}
	rec.RBDDevice = &d.ID
	if err := k.records.save(req.Volume, rec); err != nil {
		return att, err
	}
	return att, nil
}

// reuse gives the volume mapping d that an earlier call made.
func (k krbdDevice) reuse(volume string, rec volumeRecord, d krbd.Device) (attachment, error) {
	if rec.RBDDevice == nil {
		// Found by its image (an earlier call stopped before its record):
		// from now on by its number.
		rec.RBDDevice = &d.ID
		if err := k.records.save(volume, rec); err != nil {
			return attachment{}, err
		}
	}
	return attachment{Device: k.bus.Path(d)}, nil
}

// sameAccess tells whether mapping d is as read-only as req asks. A
// mapping that is not is unmapped, so that it is made again: a stage
// left by an earlier one of the other kind (a read-only stage that failed
// before its undo) would else fail every write (EROFS), or write under a
// read-only mount. One that is open is refused: a stage of the other kind
// still uses it.
func (k krbdDevice) sameAccess(ctx context.Context, req attachRequest, d krbd.Device) (bool, error) {
	ro, err := k.bus.ReadOnly(d)
	if err != nil {
		return false, fmt.Errorf("volume %s: %w", req.Volume, err)
	}
	if ro == req.ReadOnly {
		return true, nil
	}
	ctx, cancel := context.WithTimeout(ctx, krbdTimeout)
	defer cancel()
	if err := k.bus.Unmap(ctx, d); err != nil {
		if errors.Is(err, krbd.ErrBusy) {
			return false, fmt.Errorf("volume %s: the kernel maps its image as %s with read-only=%t and it is in use, asked read-only=%t: "+
				"unstage the volume first: %w: %w", req.Volume, k.bus.Path(d), ro, req.ReadOnly, err, volerr.ErrInUse)
		}
		return false, fmt.Errorf("volume %s: unmap %s, mapped with read-only=%t, to map it with read-only=%t: %w",
			req.Volume, k.bus.Path(d), ro, req.ReadOnly, err)
	}
	return false, nil
}

// krbdCause gives the kernel's answer its kind: a lock another client
// holds is in use, a refused key is the caller's to fix, unreachable
// monitors may come back.
func krbdCause(err error) error {
	switch {
	case errors.Is(err, krbd.ErrLocked):
		return fmt.Errorf("%w: %w", err, volerr.ErrInUse)
	case errors.Is(err, krbd.ErrRefused):
		return fmt.Errorf("%w: %w", err, volerr.ErrPrecondition)
	case errors.Is(err, krbd.ErrUnreachable), errors.Is(err, krbd.ErrPending), errors.Is(err, context.DeadlineExceeded):
		return fmt.Errorf("%w: %w", err, volerr.ErrUnavailable)
	case errors.Is(err, krbd.ErrNoImage):
		return fmt.Errorf("%w: %w", err, volerr.ErrNotFound)
	}
	return err
}

func (k krbdDevice) Find(_ context.Context, volume string) (string, error) {
	d, ok, err := k.mapped(volume)
	if err != nil || !ok {
		return "", err
	}
	return k.bus.Path(d), nil
}

// Detach unmaps dev, when it maps the volume's image, else the mapping
// the record finds; an open device is refused, never forced.
func (k krbdDevice) Detach(ctx context.Context, volume, dev string) error {
	rec, _, err := k.records.load(volume)
	if err != nil {
		return err
	}
	var d krbd.Device
	ok := false
	if id, isRBD := k.bus.ID(dev); isRBD {
		if pool, image, named := rec.image(); named {
			d, ok, err = k.bus.Get(id, pool, image)
		}
	}
	if err == nil && !ok {
		d, ok, err = k.mappedIn(volume, rec)
	}
	if err != nil || !ok {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, krbdTimeout)
	defer cancel()
	if err := k.bus.Unmap(ctx, d); err != nil {
		if errors.Is(err, krbd.ErrBusy) {
			return fmt.Errorf("volume %s: %w: %w", volume, err, volerr.ErrInUse)
		}
		return fmt.Errorf("volume %s: %w", volume, err)
	}
	return nil
}

// Stop unmaps what is still mapped: the kernel's client is the volume's
// only connection.
func (k krbdDevice) Stop(ctx context.Context, volume string) error {
	return k.Detach(ctx, volume, "")
}

// cephClients is the address of the mapping's own Ceph client.
func (k krbdDevice) cephClients(volume string) ([]string, error) {
	d, ok, err := k.mapped(volume)
	if err != nil || !ok {
		return nil, err
	}
	addr, err := k.bus.ClientAddr(d)
	if err != nil {
		return nil, err
	}
	return []string{addr}, nil
}

func (krbdDevice) Serving(context.Context, string) (HealResult, bool) { return HealSkipped, true }

func (krbdDevice) Heal(context.Context, string, func(context.Context) (string, error)) (HealResult, error) {
	return HealSkipped, nil
}

// Condition: a recorded mapping the kernel no longer has (its node
// rebooted under it) is abnormal until the volume is staged anew.
func (k krbdDevice) Condition(_ context.Context, volume string) (bool, string) {
	rec, _, err := k.records.load(volume)
	if err != nil {
		return true, err.Error()
	}
	if rec.RBDDevice == nil {
		return false, ""
	}
	if _, ok, err := k.mappedIn(volume, rec); err != nil {
		return true, err.Error()
	} else if !ok {
		return true, fmt.Sprintf("the kernel no longer maps its RBD image %s (rbd%d is gone)", rec.RBD, *rec.RBDDevice)
	}
	return false, ""
}

// Expand makes the kernel read the image's new size now.
func (k krbdDevice) Expand(ctx context.Context, volume string) (string, error) {
	d, ok, err := k.mapped(volume)
	if err != nil {
		return "", err
	}
	if !ok {
		return "", fmt.Errorf("volume %s: its RBD image is not mapped on this node: %w", volume, volerr.ErrPrecondition)
	}
	ctx, cancel := context.WithTimeout(ctx, krbdTimeout)
	defer cancel()
	if err := k.bus.Refresh(ctx, d); err != nil {
		return "", fmt.Errorf("volume %s: %w", volume, err)
	}
	return k.bus.Path(d), nil
}
