package agent

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/moby/sys/mountinfo"
	"golang.org/x/sys/unix"

	"github.com/berth-io/berth/internal/blockdev"
	"github.com/berth-io/berth/internal/blockdev/launch"
	"github.com/berth-io/berth/internal/keeper"
	"github.com/berth-io/berth/internal/mount"
	"github.com/berth-io/berth/internal/volerr"
)

// ErrKeeperNotShared means that the keeper mounts volumes' FUSE connections
// where this agent cannot see them, so that no userspace volume can be
// staged over FUSE on this node until the two share the run dir.
var ErrKeeperNotShared = fmt.Errorf("the keeper's mounts are not visible to this agent: userspace volumes over %s are %w on this node", TransportFUSE, ErrUnsupported)

// fuseDevice is a loop device on <root>/<volume>/disk.img, a file a
// blockdev server serves over a FUSE connection that the keeper holds, so
// that the connection outlives agent and server restarts.
type fuseDevice struct {
	userspace
	loop mount.Loop
}

func (f fuseDevice) mountpoint(volume string) string { return filepath.Join(f.cfg.Root, volume) }

// backing is the file the volume's loop device is on.
func (f fuseDevice) backing(volume string) string {
	return filepath.Join(f.mountpoint(volume), blockdev.FileName)
}

func (fuseDevice) Check(string) error { return nil }

// backingNamer is a device on a loop device over a backing file that Find
// may not reach when a forced unstage needs it: a FUSE connection that
// Stop takes away, an image in a data dir no longer mounted here.
type backingNamer interface {
	// Holds tells, with no I/O on the backing file, whether dev is on
	// the volume's backing file.
	Holds(volume, dev string) (bool, error)
}

// Holds also takes the bare "/disk.img": once the volume's connection is
// unmounted (Stop, or a healer that found the keeper restarted) while the
// loop device still holds the file, sysfs names it from the connection's
// own root. The caller found dev mounted at the volume's staging path, so
// the name is a check on that mount, not the identity itself.
func (f fuseDevice) Holds(volume, dev string) (bool, error) {
	name, found, err := f.loop.BackingName(dev)
	return found && (name == f.backing(volume) || name == "/"+blockdev.FileName), err
}

func (f fuseDevice) Attach(ctx context.Context, r attachRequest) (attachment, error) {
	_, held, err := f.server(ctx, r.Volume)
	if err != nil {
		return attachment{}, err
	}
	if err := f.ensureServer(ctx, r.Volume, r.Image); err != nil {
		return attachment{NewConnection: !held}, err
	}
	if err := f.checkVisible(ctx, r.Volume); err != nil {
		return attachment{NewConnection: !held}, err
	}
	att, err := attachLoop(ctx, f.loop, f.backing(r.Volume), r.ReadOnly)
	att.NewConnection = !held
	return att, err
}

// checkVisible refuses a keeper whose mounts this agent cannot see: one
// in another mount namespace (a pod without mount propagation), or with
// the run dir on another host folder. The keeper mounts the connection in
// its own namespace, and the loop device would find no disk.img here.
func (f fuseDevice) checkVisible(ctx context.Context, volume string) error {
	mp := f.mountpoint(volume)
	mounted, err := f.cfg.FUSEMounted(mp)
	if err != nil {
		return fmt.Errorf("volume %s: check the FUSE mount at %s: %w", volume, mp, err)
	}
	if mounted {
		return nil
	}
	keeperMP := mp
	if rec, found, err := f.server(ctx, volume); err == nil && found {
		keeperMP = rec.Mountpoint
	}
	return fmt.Errorf("volume %s: the keeper at %s mounted the volume's FUSE connection at %s as it sees it, "+
		"but this agent sees no FUSE mount at %s, so %s does not exist here: the keeper runs in another mount namespace "+
		"or sees another folder as the run dir. Run the keeper and the agent with the same --run-dir on the same host folder, "+
		"shared between them (in Kubernetes: a hostPath volume with mountPropagation Bidirectional in both pods), "+
		"then stage again: %w", volume, f.cfg.KeeperSocket, keeperMP, mp, f.backing(volume), ErrKeeperNotShared)
}

// hostFUSEMounted tells from this process's mount table whether a FUSE
// filesystem is mounted at mountpoint.
func hostFUSEMounted(mountpoint string) (bool, error) {
	return mountedAt(mountpoint, func(fsType string) bool { return strings.HasPrefix(fsType, "fuse") })
}

// mountedAt tells whether a filesystem whose type fsType accepts is
// mounted at mountpoint. The mount table holds resolved paths, so the
// parent's symlinks (a run dir under /var/run) are resolved first; never
// mountpoint itself, which a FUSE mount would answer through its server.
func mountedAt(mountpoint string, fsType func(string) bool) (bool, error) {
	dir, err := filepath.EvalSymlinks(filepath.Dir(mountpoint))
	if err != nil {
		return false, err
	}
	ms, err := mountinfo.GetMounts(mountinfo.SingleEntryFilter(filepath.Join(dir, filepath.Base(mountpoint))))
	if err != nil {
		return false, fmt.Errorf("read mountinfo: %w", err)
	}
	return slices.ContainsFunc(ms, func(m *mountinfo.Info) bool { return fsType(m.FSType) }), nil
}

func (f fuseDevice) Find(ctx context.Context, volume string) (string, error) {
	return findLoop(ctx, f.loop, f.backing(volume))
}

func (f fuseDevice) Detach(ctx context.Context, _, dev string) error {
	return detachLoop(ctx, f.loop, dev)
}

// Stop stops the volume's server and has the keeper unmount and close the
// connection, then removes the mountpoint.
func (f fuseDevice) Stop(ctx context.Context, volume string) error {
	rec, found, err := f.server(ctx, volume)
	if err != nil {
		return err
	}
	if err := f.stopServer(ctx, volume, rec.ServerPID != 0); err != nil {
		return err
	}
	if found {
		if err := f.cfg.Keeper.Close(ctx, volume); err != nil {
			return fmt.Errorf("keeper close %s: %w", volume, err)
		}
	} else if err := unix.Unmount(f.mountpoint(volume), unix.MNT_DETACH); err != nil &&
		!errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		// A keeper that was restarted left the dead mount behind.
		return fmt.Errorf("unmount lost connection of %s: %w", volume, err)
	}
	if err := os.Remove(f.mountpoint(volume)); err != nil && !errors.Is(err, os.ErrNotExist) {
		f.log.Error(err, "remove blockdev mountpoint", "volume", volume)
	}
	return nil
}

func (f fuseDevice) Serving(ctx context.Context, volume string) (HealResult, bool) {
	if rec, _, err := f.server(ctx, volume); err == nil && rec.ServerPID != 0 {
		return HealServing, true
	}
	return "", false
}

// Heal starts a server that takes the FUSE connection over from the keeper.
func (f fuseDevice) Heal(ctx context.Context, volume string, image func(context.Context) (string, error)) (HealResult, error) {
	rec, found, err := f.server(ctx, volume)
	switch {
	case err != nil:
		return HealSkipped, err
	case !found:
		return HealSkipped, fmt.Errorf("volume %s: the keeper no longer holds its FUSE connection (the keeper was restarted?): %w", volume, ErrConnectionLost)
	case rec.ServerPID != 0:
		return HealServing, nil
	}
	return restartServer(ctx, volume, image, f.startServer)
}

func (f fuseDevice) Expand(ctx context.Context, volume string) (string, error) {
	return refreshLoop(ctx, f.loop, volume, f.backing(volume))
}

// checkTimeout bounds the wait for a server's answer in a condition check.
const checkTimeout = 5 * time.Second

// Condition checks the keeper, the volume's connection and its server.
func (f fuseDevice) Condition(ctx context.Context, volume string) (abnormal bool, msg string) {
	if err := f.cfg.Keeper.Ping(ctx); err != nil {
		return true, fmt.Sprintf("%s on this node: the volume's FUSE connection is lost and its I/O fails. "+
			"Start the keeper again, then restart the pods using this volume so that it is staged anew (%v)", ErrKeeperDown, err)
	}
	rec, found, err := f.server(ctx, volume)
	switch {
	case err != nil:
		return true, err.Error()
	case !found:
		return true, "the keeper no longer holds this volume's FUSE connection (the keeper was restarted?): its I/O fails; restart the pods using this volume so that it is staged anew"
	case rec.ServerPID == 0:
		return true, "no blockdev server is running for this volume: its I/O waits until the agent's healer starts one"
	}
	// statfs waits while no server runs (one may die after the check
	// above): bound the wait, the goroutine ends when a server answers.
	checked := make(chan error, 1)
	go func() { checked <- f.cfg.CheckMount(f.mountpoint(volume)) }()
	select {
	case err := <-checked:
		if err != nil {
			return true, fmt.Sprintf("userspace block device: %v; restart the pods using this volume so that it is staged anew", err)
		}
	case <-time.After(checkTimeout):
		return true, fmt.Sprintf("the blockdev server of this volume did not answer within %s: its I/O waits", checkTimeout)
	}
	return false, ""
}

// server returns the keeper's record of volume (found false when the keeper
// holds no connection for it).
func (f fuseDevice) server(ctx context.Context, volume string) (keeper.Volume, bool, error) {
	// One volume's entry, not the whole List: a pass after an agent
	// restart asks for every volume at once.
	v, found, err := f.cfg.Keeper.Status(ctx, volume)
	if err != nil {
		if errors.Is(err, keeper.ErrUnavailable) {
			return keeper.Volume{}, false, fmt.Errorf("%w: %w", ErrKeeperDown, err)
		}
		return keeper.Volume{}, false, fmt.Errorf("keeper connection of %s: %w", volume, err)
	}
	return v, found, nil
}

// ensureServer makes sure a server serves volume, starting one when none
// runs; the new server opens the connection or takes over the held one.
func (f fuseDevice) ensureServer(ctx context.Context, volume, image string) error {
	rec, _, err := f.server(ctx, volume)
	if err != nil {
		return err
	}
	if rec.ServerPID != 0 {
		return nil
	}
	return f.startServer(ctx, volume, image)
}

func (f fuseDevice) startServer(ctx context.Context, volume, image string) error {
	_, err := f.start(ctx, launch.Params{
		KeeperSocket: f.cfg.KeeperSocket, Volume: volume, Image: image,
		Mountpoint: f.mountpoint(volume), Passthrough: f.cfg.Passthrough,
	})
	return err
}

// stopServer stops the volume's FUSE server: the one this agent started
// through its own handle, and any other the keeper knows live (live) through
// the keeper, which holds a pidfd of it. The pid the keeper reports is of
// the keeper's PID namespace (the host's), so it is never signalled here.
func (f fuseDevice) stopServer(ctx context.Context, volume string, live bool) error {
	if p := f.procs.Take(volume); p != nil {
		if err := p.Stop(f.cfg.StopTimeout); err != nil {
			return fmt.Errorf("stop blockdev server of %s: %w", volume, err)
		}
	}
	if !live {
		return nil
	}
	if err := f.cfg.Keeper.Stop(ctx, volume); err != nil {
		if errors.Is(err, volerr.ErrInvalid) {
			return fmt.Errorf("stop blockdev server of %s: the keeper predates the stop request; restart the keeper pod: %w", volume, err)
		}
		return fmt.Errorf("stop blockdev server of %s: %w", volume, err)
	}
	return nil
}
