package agent

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	v1 "github.com/berth-io/berth/api/v1alpha1"
	"github.com/berth-io/berth/internal/atomicfile"
	"github.com/berth-io/berth/internal/blockdev/launch"
)

// Transport is how a userspace volume's server reaches the kernel.
type Transport = v1.UserspaceTransport

// The transports (v1alpha1.UserspaceTransport).
const (
	TransportFUSE = v1.TransportFUSE
	TransportNBD  = v1.TransportNBD
)

// ParseTransport checks a transport name; "" is the default, fuse.
func ParseTransport(s string) (Transport, error) {
	switch Transport(s) {
	case "", TransportFUSE:
		return TransportFUSE, nil
	case TransportNBD:
		return TransportNBD, nil
	}
	return "", fmt.Errorf("unknown userspace transport %q (want %s or %s)", s, TransportFUSE, TransportNBD)
}

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

// nbdRecord marks a volume staged over nbd and holds its server's pid. It
// is written before the server starts and removed last at unstage, so a
// volume's transport never depends on the agent's current setting.
func (a *Agent) nbdRecord(volume string) string { return filepath.Join(a.us.Root, volume+".nbd") }

// transport returns how volume is served: as recorded when it is staged
// here, else as this agent is set to serve new volumes.
func (a *Agent) transport(volume string) Transport {
	if a.isNBD(volume) {
		return TransportNBD
	}
	if a.isUserspace(volume) || a.us.Transport == "" {
		return TransportFUSE
	}
	return a.us.Transport
}

// stageTransport is the transport a stage of volume uses: the one it is
// staged with, else its StorageCluster's (the agent serves every cluster,
// each with its own choice), else the agent's default.
func (a *Agent) stageTransport(volume string, sc *v1.StorageCluster) Transport {
	if a.isNBD(volume) || a.isUserspace(volume) || sc == nil || sc.Spec.Agent.UserspaceTransport == "" {
		return a.transport(volume)
	}
	return sc.Spec.Agent.UserspaceTransport
}

// isNBD tells whether volume is (being) staged over nbd on this node.
func (a *Agent) isNBD(volume string) bool {
	if a.us == nil {
		return false
	}
	_, err := os.Stat(a.nbdRecord(volume))
	return err == nil
}

// nbdServer finds the volume's running server: by the pid in its record,
// else (a crash between start and record) by scanning the process table.
// A pid counts only while its command line still names the volume.
func (a *Agent) nbdServer(volume string) (pid int, found bool, err error) {
	b, err := os.ReadFile(a.nbdRecord(volume))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return 0, false, fmt.Errorf("read nbd record of %s: %w", volume, err)
	}
	if pid, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && a.servesNBD(pid, volume) {
		return pid, true, nil
	}
	entries, err := os.ReadDir(a.procRoot())
	if err != nil {
		return 0, false, fmt.Errorf("list processes: %w", err)
	}
	for _, e := range entries {
		if pid, err := strconv.Atoi(e.Name()); err == nil && a.servesNBD(pid, volume) {
			return pid, true, nil
		}
	}
	return 0, false, nil
}

func (a *Agent) procRoot() string {
	if a.us.ProcRoot != "" {
		return a.us.ProcRoot
	}
	return "/proc"
}

// servesNBD tells whether pid is a berth blockdev nbd server of volume.
func (a *Agent) servesNBD(pid int, volume string) bool {
	if pid <= 0 {
		return false
	}
	b, err := os.ReadFile(filepath.Join(a.procRoot(), strconv.Itoa(pid), "cmdline"))
	if err != nil {
		return false
	}
	args := strings.Split(string(bytes.TrimRight(b, "\x00")), "\x00")
	pair := func(flag, val string) bool {
		i := slices.Index(args, flag)
		return (i >= 0 && i+1 < len(args) && args[i+1] == val) || slices.Contains(args, flag+"="+val)
	}
	return slices.Contains(args, "blockdev") && pair("--volume", volume) && pair("--transport", string(TransportNBD))
}

// nbdEnsureServer makes sure a server serves volume's nbd device, starting
// one when none runs (started): it connects a new device, or reconnects
// the one the kernel kept. The caller holds the volume lock.
func (a *Agent) nbdEnsureServer(ctx context.Context, volume, image string) (started bool, err error) {
	if _, found, err := a.nbdServer(volume); err != nil || found {
		return false, err
	}
	if ok, reason := a.us.NBD.Available(); !ok {
		return false, nbdUnavailable(volume, reason)
	}
	if err := os.MkdirAll(a.us.Root, 0o700); err != nil {
		return false, fmt.Errorf("userspace root: %w", err)
	}
	if err := atomicfile.Write(a.nbdRecord(volume), nil, 0o600); err != nil {
		return false, fmt.Errorf("nbd record of %s: %w", volume, err)
	}
	proc, err := a.startServer(ctx, launch.Params{
		Node: a.node, Volume: volume, Image: image, Transport: string(TransportNBD), DeadConnTimeout: a.us.DeadConnTimeout,
	})
	if err != nil {
		return false, err
	}
	if err := atomicfile.Write(a.nbdRecord(volume), []byte(strconv.Itoa(proc.PID())+"\n"), 0o600); err != nil {
		// The server is found by its command line all the same.
		a.log.Error(err, "record nbd server pid", "volume", volume, "pid", proc.PID())
	}
	return true, nil
}

// nbdDevice is the block device of a volume served over nbd.
func (a *Agent) nbdDevice(volume string) (string, error) {
	dev, found, err := a.us.NBD.Device(volume)
	if err != nil {
		return "", fmt.Errorf("find nbd device of %s: %w", volume, err)
	}
	if !found {
		return "", fmt.Errorf("volume %s: the kernel has no nbd device for it (disconnected, or the node rebooted): %w",
			volume, ErrConnectionLost)
	}
	return dev, nil
}

// nbdStop disconnects the volume's device, stops its server (which the
// disconnect usually ends already) and drops its records. Idempotent.
func (a *Agent) nbdStop(volume string) error {
	if err := a.us.NBD.Disconnect(volume); err != nil {
		return fmt.Errorf("disconnect nbd device of %s: %w", volume, err)
	}
	if p := a.procs.take(volume); p != nil {
		if err := p.Stop(a.us.StopTimeout); err != nil {
			return fmt.Errorf("stop nbd blockdev server of %s: %w", volume, err)
		}
	}
	// One an earlier agent started: found in this agent's own /proc by its
	// command line, so the pid is of this PID namespace.
	pid, found, err := a.nbdServer(volume)
	if err != nil {
		return err
	}
	if found {
		still := func() bool { return a.servesNBD(pid, volume) }
		if err := a.us.StopPID(pid, a.us.StopTimeout, still); err != nil {
			return fmt.Errorf("stop nbd blockdev server of %s: %w", volume, err)
		}
	}
	if err := os.Remove(a.usLog(volume)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove record of %s: %w", volume, err)
	}
	if err := atomicfile.Remove(a.nbdRecord(volume)); err != nil {
		return fmt.Errorf("remove nbd record of %s: %w", volume, err)
	}
	return nil
}

// nbdCondition checks the volume's server and device.
func (a *Agent) nbdCondition(volume string) (abnormal bool, msg string) {
	if _, found, err := a.us.NBD.Device(volume); err != nil {
		return true, fmt.Sprintf("cannot find this volume's nbd device: %v", err)
	} else if !found {
		return true, "the kernel no longer has this volume's nbd device: its I/O fails; restart the pods using this volume so that it is staged anew"
	}
	if _, found, err := a.nbdServer(volume); err != nil {
		return true, err.Error()
	} else if !found {
		return true, "no blockdev server is connected to this volume's nbd device: its I/O waits for the " +
			"dead-connection timeout at most, then fails until the agent's healer starts one"
	}
	return false, ""
}

// nbdHeal starts a server for a staged nbd volume whose server is gone; the
// caller holds the volume lock and checked the Volume.
func (a *Agent) nbdHeal(ctx context.Context, volume, image string) (HealResult, error) {
	// Without its device a new server would connect a new, empty one.
	if _, err := a.nbdDevice(volume); err != nil {
		return HealSkipped, err
	}
	started, err := a.nbdEnsureServer(ctx, volume, image)
	switch {
	case err != nil:
		return HealSkipped, err
	case started:
		return HealRestarted, nil
	}
	return HealServing, nil
}
