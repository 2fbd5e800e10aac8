package agent

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	v1 "github.com/berth-io/berth/api/v1alpha1"
	"github.com/berth-io/berth/internal/atomicfile"
	"github.com/berth-io/berth/internal/blockdev"
	"github.com/berth-io/berth/internal/blockdev/launch"
	"github.com/berth-io/berth/internal/keeper"
	"github.com/berth-io/berth/internal/volerr"
)

// Keeper is the part of the keeper client (internal/keeper) the agent uses.
type Keeper interface {
	Ping(ctx context.Context) error
	List(ctx context.Context) ([]keeper.Volume, error)
	Close(ctx context.Context, volume string) error
	// Stop ends the volume's server through the keeper's handle on it.
	Stop(ctx context.Context, volume string) error
}

// Server is a started blockdev server process (launch.Process).
type Server interface {
	// PID is the server's pid in this process's PID namespace (for logs).
	PID() int
	// Stop ends the server through the handle this process holds on its
	// child (never a pid number that may name another process by now).
	Stop(timeout time.Duration) error
}

// servers are the blockdev servers this agent process started, by volume:
// it stops them through its own handles. Servers an earlier agent started
// are stopped through the keeper (FUSE), whose pids are of its PID
// namespace, not necessarily this one.
type servers struct {
	mu   sync.Mutex
	byID map[string]Server
}

func (s *servers) put(volume string, p Server) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.byID == nil {
		s.byID = map[string]Server{}
	}
	s.byID[volume] = p
}

func (s *servers) take(volume string) Server {
	s.mu.Lock()
	defer s.mu.Unlock()
	p := s.byID[volume]
	delete(s.byID, volume)
	return p
}

// StartServer adapts launch.Start to UserspaceConfig.Start.
func StartServer(ctx context.Context, p launch.Params) (Server, error) {
	proc, err := launch.Start(ctx, p)
	if err != nil {
		return nil, err
	}
	return proc, nil
}

// UserspaceConfig enables volumes with mounter userspace: a berth blockdev
// server per volume serves <Root>/<volume>/disk.img through FUSE, and a loop
// device on that file is the volume's block device.
type UserspaceConfig struct {
	// Root holds one FUSE mountpoint and one server log per volume.
	Root         string
	Binary       string
	KeeperSocket string
	Keeper       Keeper
	// Start runs a server (launch.Start); StopPID stops an nbd server
	// this agent found in its own /proc (launch.StopPID); CheckMount
	// checks a live connection.
	Start      func(ctx context.Context, p launch.Params) (Server, error)
	StopPID    func(pid int, timeout time.Duration, still func() bool) error
	CheckMount func(mountpoint string) error
	Workers    int
	// Passthrough lets the kernel do data I/O on the image (kernel 6.9+;
	// the server falls back to serving it when the kernel does not offer it).
	Passthrough bool
	StopTimeout time.Duration
	// Transport serves new userspace volumes over FUSE + loop (default) or
	// nbd; a staged volume keeps the transport it was staged with.
	Transport Transport
	// NBD is the kernel nbd driver (Transport nbd).
	NBD NBD
	// DeadConnTimeout is how long the kernel queues an nbd device's I/O
	// while no server is connected; then I/O fails until a server
	// reconnects (the device stays until it is disconnected); 0: the
	// server's default.
	DeadConnTimeout time.Duration
	// ProcRoot is where processes are listed ("" is /proc).
	ProcRoot string
}

// WithUserspace enables the userspace mounter.
func (a *Agent) WithUserspace(c UserspaceConfig) *Agent {
	if c.StopTimeout == 0 {
		c.StopTimeout = 10 * time.Second
	}
	a.us = &c
	return a
}

// ErrKeeperDown means that the keeper does not answer, so userspace volumes of this
// node have lost (or cannot get) their FUSE connection.
var ErrKeeperDown = errors.New("berth keeper is not running")

// ErrConnectionLost means that the volume's kernel connection is gone (the
// keeper no longer holds its FUSE connection, or the kernel no longer has
// its nbd device), so the volume's I/O fails until it is staged anew.
var ErrConnectionLost = errors.New("the volume's kernel connection is lost")

func (a *Agent) usMountpoint(volume string) string { return filepath.Join(a.us.Root, volume) }

// usLog is the servers' log of volume. Its presence (or that of the nbd
// record) also records that the volume is staged in userspace: it lives
// beside the FUSE mountpoint, so checking it never waits on a FUSE server.
func (a *Agent) usLog(volume string) string { return filepath.Join(a.us.Root, volume+".log") }

// isUserspace tells whether volume is (being) staged through a blockdev
// server on this node.
func (a *Agent) isUserspace(volume string) bool {
	if a.us == nil {
		return false
	}
	for _, record := range []string{a.usLog(volume), a.nbdRecord(volume)} {
		if _, err := os.Stat(record); err == nil {
			return true
		}
	}
	return false
}

// backingFile is the file the volume's loop device is on: the FUSE file of
// a userspace volume, else the image.
func (a *Agent) backingFile(ctx context.Context, volume string) (string, error) {
	if a.isUserspace(volume) {
		return filepath.Join(a.usMountpoint(volume), blockdev.FileName), nil
	}
	return a.imagePath(ctx, volume)
}

// server returns the keeper's record of volume (found false when the keeper
// holds no connection for it).
func (a *Agent) server(ctx context.Context, volume string) (keeper.Volume, bool, error) {
	vols, err := a.us.Keeper.List(ctx)
	if err != nil {
		if errors.Is(err, keeper.ErrUnavailable) {
			return keeper.Volume{}, false, fmt.Errorf("%w: %w", ErrKeeperDown, err)
		}
		return keeper.Volume{}, false, fmt.Errorf("list keeper connections: %w", err)
	}
	for _, v := range vols {
		if v.Name == volume {
			return v, true, nil
		}
	}
	return keeper.Volume{}, false, nil
}

// ensureServer makes sure a server serves volume, starting one when none
// runs; the new server opens the connection or takes over the held one. The
// caller holds the volume lock.
func (a *Agent) ensureServer(ctx context.Context, volume, image string) error {
	if a.us == nil {
		return fmt.Errorf("volume %s: mounter userspace: %w on this agent", volume, ErrUnsupported)
	}
	rec, _, err := a.server(ctx, volume)
	if err != nil {
		return err
	}
	if rec.ServerPID != 0 {
		return nil
	}
	_, err = a.startServer(ctx, launch.Params{
		KeeperSocket: a.us.KeeperSocket, Volume: volume, Image: image,
		Mountpoint: a.usMountpoint(volume), Passthrough: a.us.Passthrough,
	})
	return err
}

// startServer starts a blockdev server for p.Volume (either transport)
// with its output appended to the volume's server log.
func (a *Agent) startServer(ctx context.Context, p launch.Params) (Server, error) {
	if err := os.MkdirAll(a.us.Root, 0o700); err != nil {
		return nil, fmt.Errorf("userspace root: %w", err)
	}
	// A file, not a pipe: the server outlives the agent and must not die of
	// SIGPIPE when the agent is gone.
	logf, err := os.OpenFile(a.usLog(p.Volume), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, fmt.Errorf("server log of %s: %w", p.Volume, err)
	}
	defer func() { _ = logf.Close() }()
	// The log is also the record that the volume is staged through a
	// server (isUserspace): it must survive a crash.
	if err := atomicfile.SyncDir(a.us.Root); err != nil {
		return nil, fmt.Errorf("server log of %s: %w", p.Volume, err)
	}
	p.Binary, p.Workers, p.Stderr = a.us.Binary, a.us.Workers, logf
	proc, err := a.us.Start(ctx, p)
	if err != nil {
		return nil, fmt.Errorf("start blockdev server of %s (log %s): %w", p.Volume, a.usLog(p.Volume), err)
	}
	a.procs.put(p.Volume, proc)
	a.log.Info("blockdev server started", "volume", p.Volume, "transport", p.Transport, "pid", proc.PID())
	return proc, nil
}

// stopUserspace stops the volume's server and has the keeper unmount and
// close the connection, then drops the volume's record. The loop device
// must be detached already. Idempotent.
func (a *Agent) stopUserspace(ctx context.Context, volume string) error {
	if !a.isUserspace(volume) {
		return nil
	}
	if a.isNBD(volume) {
		return a.nbdStop(volume)
	}
	rec, found, err := a.server(ctx, volume)
	if err != nil {
		return err
	}
	if err := a.stopServer(ctx, volume, rec.ServerPID != 0); err != nil {
		return err
	}
	if found {
		if err := a.us.Keeper.Close(ctx, volume); err != nil {
			return fmt.Errorf("keeper close %s: %w", volume, err)
		}
	} else if err := unix.Unmount(a.usMountpoint(volume), unix.MNT_DETACH); err != nil &&
		!errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		// A keeper that was restarted left the dead mount behind.
		return fmt.Errorf("unmount lost connection of %s: %w", volume, err)
	}
	if err := os.Remove(a.usMountpoint(volume)); err != nil && !errors.Is(err, os.ErrNotExist) {
		a.log.Error(err, "remove blockdev mountpoint", "volume", volume)
	}
	if err := os.Remove(a.usLog(volume)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove record of %s: %w", volume, err)
	}
	return nil
}

// stopServer stops the volume's FUSE server: the one this agent started
// through its own handle, and any other the keeper knows live (live) through
// the keeper, which holds a pidfd of it. The pid the keeper reports is of
// the keeper's PID namespace (the host's), so it is never signalled here.
func (a *Agent) stopServer(ctx context.Context, volume string, live bool) error {
	if p := a.procs.take(volume); p != nil {
		if err := p.Stop(a.us.StopTimeout); err != nil {
			return fmt.Errorf("stop blockdev server of %s: %w", volume, err)
		}
	}
	if !live {
		return nil
	}
	if err := a.us.Keeper.Stop(ctx, volume); err != nil {
		if errors.Is(err, volerr.ErrInvalid) {
			return fmt.Errorf("stop blockdev server of %s: the keeper predates the stop request; restart the keeper pod: %w", volume, err)
		}
		return fmt.Errorf("stop blockdev server of %s: %w", volume, err)
	}
	return nil
}

// prepareUnstage readies a userspace volume for unmount and detach: a
// server must run, or flushing the file system would wait for one.
func (a *Agent) prepareUnstage(ctx context.Context, volume string) error {
	if !a.isUserspace(volume) {
		return nil
	}
	if a.isNBD(volume) {
		// A device that is gone (disconnected) fails I/O at once: nothing to
		// wait for. Starting a server then would make a new device.
		if _, found, err := a.us.NBD.Device(volume); err != nil || !found {
			return err
		}
		image, err := a.imagePath(ctx, volume)
		if err != nil {
			return err
		}
		_, err = a.nbdEnsureServer(ctx, volume, image)
		return err
	}
	// With the keeper down or the connection gone, I/O fails fast: there
	// is nothing to wait for, so a failed check is no reason to stop.
	if rec, found, err := a.server(ctx, volume); err == nil && found && rec.ServerPID == 0 {
		image, err := a.imagePath(ctx, volume)
		if err != nil {
			return err
		}
		return a.ensureServer(ctx, volume, image)
	}
	return nil
}

// HealResult says what Heal found or did.
type HealResult string

const (
	// HealSkipped means not a userspace volume staged here, or its objects are gone.
	HealSkipped HealResult = "skipped"
	// HealServing means that a server was already running.
	HealServing HealResult = "serving"
	// HealRestarted means that a new server took the connection over from the keeper.
	HealRestarted HealResult = "restarted"
	// HealBusy means that another operation held the volume: try again later.
	HealBusy HealResult = "busy"
)

// Heal restarts the blockdev server of a staged userspace volume whose
// server is gone (after an agent restart or a server crash): the new server
// takes the FUSE connection over from the keeper, and I/O that waited goes
// on. It waits a bounded time for the volume lock, shared with stage and
// unstage (ErrBusy when it stays held: the healer retries later). It returns
// the Volume (nil when gone), ErrKeeperDown or ErrConnectionLost when the
// volume cannot be healed, ErrVolumeNotFound (with HealSkipped) when a
// staged userspace volume's Volume object or image is gone.
func (a *Agent) Heal(ctx context.Context, volumeID string) (*v1.Volume, HealResult, error) {
	if a.us == nil {
		return nil, HealSkipped, nil
	}
	// The common case, a live server, needs no lock: periodic passes then
	// never make a CSI call on the volume wait or fail as busy.
	if a.isNBD(volumeID) {
		if _, found, err := a.nbdServer(volumeID); err == nil && found {
			return nil, HealServing, nil
		}
	} else if rec, _, err := a.server(ctx, volumeID); err == nil && rec.ServerPID != 0 {
		return nil, HealServing, nil
	}
	unlock, err := a.lockBackground(ctx, volumeID)
	if err != nil {
		return nil, HealBusy, err
	}
	defer unlock()
	vol, err := a.volume(ctx, volumeID)
	if errors.Is(err, ErrVolumeNotFound) {
		if !a.isUserspace(volumeID) {
			return nil, HealSkipped, nil // a kernel volume needs no server
		}
		return nil, HealSkipped, fmt.Errorf("volume %s is staged in userspace on this node, but its Volume object is gone, "+
			"so no blockdev server can be started for it: its I/O waits until it is unstaged: %w", volumeID, err)
	}
	if err != nil {
		return nil, HealSkipped, err
	}
	if vol.Spec.Mounter != v1.MounterUserspace || !a.isUserspace(volumeID) {
		return vol, HealSkipped, nil
	}
	image, err := a.imagePath(ctx, volumeID)
	if errors.Is(err, ErrVolumeNotFound) {
		return vol, HealSkipped, fmt.Errorf("volume %s is staged in userspace on this node, but its image is gone, "+
			"so no blockdev server can be started for it: its I/O waits until it is unstaged: %w", volumeID, err)
	}
	if err != nil {
		return vol, HealSkipped, err
	}
	if a.isNBD(volumeID) {
		res, err := a.nbdHeal(ctx, volumeID, image)
		return vol, res, err
	}
	rec, found, err := a.server(ctx, volumeID)
	switch {
	case err != nil:
		return vol, HealSkipped, err
	case !found:
		return vol, HealSkipped, fmt.Errorf("volume %s: the keeper no longer holds its FUSE connection (the keeper was restarted?): %w", volumeID, ErrConnectionLost)
	case rec.ServerPID != 0:
		return vol, HealServing, nil
	}
	if err := a.ensureServer(ctx, volumeID, image); err != nil {
		return vol, HealSkipped, err
	}
	return vol, HealRestarted, nil
}

// checkTimeout bounds the wait for a server's answer in a condition check.
const checkTimeout = 5 * time.Second

// usCondition checks the keeper, the volume's connection and its server.
func (a *Agent) usCondition(ctx context.Context, volume string) (abnormal bool, msg string) {
	if a.isNBD(volume) {
		return a.nbdCondition(volume)
	}
	if err := a.us.Keeper.Ping(ctx); err != nil {
		return true, fmt.Sprintf("%s on this node: the volume's FUSE connection is lost and its I/O fails. "+
			"Start the keeper again, then restart the pods using this volume so that it is staged anew (%v)", ErrKeeperDown, err)
	}
	rec, found, err := a.server(ctx, volume)
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
	go func() { checked <- a.us.CheckMount(a.usMountpoint(volume)) }()
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
