package ublk

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/berth-io/berth/internal/volerr"
)

// The errors a caller decides on. Each names the kernel feature that is
// missing, so that a refused stage says what the node lacks.
var (
	// ErrNoUblk: the kernel has no ublk driver (or it is not loaded).
	ErrNoUblk = volerr.New(volerr.ErrPrecondition,
		"the kernel has no ublk driver (CONFIG_BLK_DEV_UBLK, Linux >= 6.0; modprobe ublk_drv)")
	// ErrNoRecovery: the driver cannot keep a device while its server is
	// gone (UBLK_F_USER_RECOVERY with _REISSUE), so a server restart would
	// fail I/O.
	ErrNoRecovery = volerr.New(volerr.ErrPrecondition,
		"the kernel's ublk driver has no user recovery (UBLK_F_USER_RECOVERY and UBLK_F_USER_RECOVERY_REISSUE)")
	// ErrNotThisDevice: a device to recover is another volume's (Tag).
	ErrNotThisDevice = volerr.New(volerr.ErrPrecondition, "ublk: the device belongs to another volume")
	// ErrTimeout: a command did not complete in time; the kernel was asked
	// to cancel it.
	ErrTimeout = volerr.New(volerr.ErrUnavailable, "ublk: command timed out")
)

// AnyDevice as DevInfo.DevID at AddDevice lets the kernel pick the number.
const AnyDevice = autoDevID

// DefaultTimeout bounds a control command when ControlConfig sets none.
// START_DEV and END_USER_RECOVERY wait in the kernel until every queue has
// fetched, so it covers a server's start.
const DefaultTimeout = 10 * time.Second

// recoveryRetry is the pause between START_USER_RECOVERY attempts while the
// kernel still releases the dead server's device file (EBUSY).
const recoveryRetry = 50 * time.Millisecond

// Clock is the time source of retries.
type Clock interface {
	Now() time.Time
	Sleep(d time.Duration)
}

type realClock struct{}

func (realClock) Now() time.Time        { return time.Now() }
func (realClock) Sleep(d time.Duration) { time.Sleep(d) }

// ControlConfig configures OpenControl. Zero values mean the defaults.
type ControlConfig struct {
	// Dev is the directory of the device nodes: "" means /dev.
	Dev string
	// Timeout bounds each command: 0 means DefaultTimeout.
	Timeout time.Duration
	// Clock paces retries: nil means the real clock.
	Clock Clock
}

func (c ControlConfig) dev() string {
	if c.Dev == "" {
		return "/dev"
	}
	return c.Dev
}

// ControlPath is the control device's path in dev ("" means /dev).
func ControlPath(dev string) string {
	return filepath.Join(ControlConfig{Dev: dev}.dev(), "ublk-control")
}

// CharPath is device id's char device (its server's side) in dev.
func CharPath(dev string, id uint32) string {
	return filepath.Join(ControlConfig{Dev: dev}.dev(), "ublkc"+strconv.FormatUint(uint64(id), 10))
}

// BlockPath is device id's block device in dev.
func BlockPath(dev string, id uint32) string {
	return filepath.Join(ControlConfig{Dev: dev}.dev(), "ublkb"+strconv.FormatUint(uint64(id), 10))
}

// cmdRunner runs one control command: a URING_CMD of cmdOp with the
// command bytes cmd on fd, waiting up to timeout for its result (a
// negative errno on failure). After a timeout it must have asked the
// kernel to cancel the command, and answer ErrTimeout.
type cmdRunner interface {
	run(fd int, cmdOp uint32, cmd []byte, timeout time.Duration) (int32, error)
	close() error
}

// Control is a client of /dev/ublk-control. Its methods are safe for
// concurrent use; commands run one at a time.
type Control struct {
	fd      int
	timeout time.Duration
	clock   Clock

	mu     sync.Mutex
	runner cmdRunner
	// payload is where a command's buffer (addr) points: mmapped memory,
	// because the kernel writes it after Go code has let go of it, and
	// Go's stacks move.
	payload []byte
}

// OpenControl opens the control device. A kernel without ublk gives
// ErrNoUblk.
func OpenControl(cfg ControlConfig) (*Control, error) {
	path := ControlPath(cfg.Dev)
	fd, err := unix.Open(path, unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ENODEV) || errors.Is(err, unix.ENXIO) {
			return nil, fmt.Errorf("ublk: %s: %w: %w", path, err, ErrNoUblk)
		}
		return nil, fmt.Errorf("ublk: open %s: %w", path, err)
	}
	payload, err := unix.Mmap(-1, 0, os.Getpagesize(), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("ublk: command buffer: %w", err)
	}
	r, err := newRingRunner()
	if err != nil {
		unix.Close(fd)
		_ = unix.Munmap(payload)
		return nil, fmt.Errorf("ublk: %w", err)
	}
	c := newControl(fd, r, payload, cfg)
	return c, nil
}

func newControl(fd int, r cmdRunner, payload []byte, cfg ControlConfig) *Control {
	c := &Control{fd: fd, timeout: cfg.Timeout, clock: cfg.Clock, runner: r, payload: payload}
	if c.timeout <= 0 {
		c.timeout = DefaultTimeout
	}
	if c.clock == nil {
		c.clock = realClock{}
	}
	return c
}

// Close releases the control device.
func (c *Control) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.runner == nil {
		return nil
	}
	err := c.runner.close()
	c.runner = nil
	if c.fd >= 0 {
		err = errors.Join(err, unix.Close(c.fd))
		c.fd = -1
	}
	return err
}

// command runs one control command for device id. in, if not nil, fills
// the payload (and says how many bytes it sends); out, if not nil, reads
// what the kernel wrote there.
func (c *Control) command(name string, op uint32, id uint32, data uint64, in func(b []byte) int, out func(b []byte) error) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.runner == nil {
		return fmt.Errorf("ublk: %s: control device closed", name)
	}
	cmd := ctrlCmd{DevID: id, QueueID: noQueue, Data: data}
	if in != nil {
		clear(c.payload)
		cmd.Len = uint16(in(c.payload))
		cmd.Addr = uint64(uintptr(unsafe.Pointer(&c.payload[0])))
	}
	var b [ctrlCmdSize]byte
	cmd.encode(b[:])
	res, err := c.runner.run(c.fd, op, b[:], c.timeout)
	if err != nil {
		return fmt.Errorf("ublk: %s of device %d: %w", name, int32(id), err)
	}
	if res < 0 {
		return fmt.Errorf("ublk: %s of device %d: %w", name, int32(id), unix.Errno(-res))
	}
	if out != nil {
		if err := out(c.payload[:cmd.Len]); err != nil {
			return fmt.Errorf("ublk: %s of device %d: %w", name, int32(id), err)
		}
	}
	return nil
}

// Features asks the kernel which ublk features it has (GET_FEATURES): the
// Flag* bits. A driver too old to tell (before Linux 6.5) is one without
// the recovery berth needs, and gives ErrNoRecovery.
func (c *Control) Features() (uint64, error) {
	var f uint64
	err := c.command("GET_FEATURES", uCmdGetFeatures, 0, 0,
		func([]byte) int { return featuresLen },
		func(b []byte) error { f = le.Uint64(b); return nil })
	if errors.Is(err, unix.EOPNOTSUPP) || errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENODEV) {
		return 0, fmt.Errorf("%w (the driver predates UBLK_U_CMD_GET_FEATURES, Linux 6.5): %w", err, ErrNoRecovery)
	}
	return f, err
}

// RequireRecovery checks features (from Features) for what a berth server
// needs: user recovery that reissues what a dead server held, and
// ioctl-encoded commands.
func RequireRecovery(features uint64) error {
	if features&FlagUserRecovery == 0 || features&FlagUserRecoveryReissue == 0 {
		return fmt.Errorf("ublk: features %#x: %w", features, ErrNoRecovery)
	}
	if features&FlagCmdIoctlEncode == 0 {
		return fmt.Errorf("ublk: features %#x: %w", features,
			volerr.New(volerr.ErrPrecondition, "the kernel's ublk driver has no ioctl-encoded commands (UBLK_F_CMD_IOCTL_ENCODE)"))
	}
	return nil
}

// Probe tells whether this node can serve ublk devices with recovery: nil,
// or an error of ErrNoUblk or ErrNoRecovery that names what is missing.
func Probe(cfg ControlConfig) (features uint64, err error) {
	c, err := OpenControl(cfg)
	if err != nil {
		return 0, err
	}
	defer c.Close()
	if features, err = c.Features(); err != nil {
		return 0, err
	}
	return features, RequireRecovery(features)
}

// AddDevice adds a device (ADD_DEV) as info asks: DevID (or AnyDevice),
// NrHWQueues, QueueDepth, MaxIOBufBytes, Flags. It returns what the kernel
// made: the device number and the flags it granted.
func (c *Control) AddDevice(info DevInfo) (DevInfo, error) {
	info.Flags |= FlagCmdIoctlEncode
	var got DevInfo
	err := c.command("ADD_DEV", uCmdAddDev, info.DevID, 0,
		func(b []byte) int { info.encode(b); return devInfoSize },
		func(b []byte) (err error) { got, err = DecodeDevInfo(b); return err })
	return got, err
}

// DeviceInfo returns device id's info (GET_DEV_INFO).
func (c *Control) DeviceInfo(id uint32) (DevInfo, error) {
	var got DevInfo
	err := c.command("GET_DEV_INFO", uCmdGetDevInfo, id, 0,
		func([]byte) int { return devInfoSize },
		func(b []byte) (err error) { got, err = DecodeDevInfo(b); return err })
	return got, err
}

// SetParams sets device id's parameters (SET_PARAMS), before it starts.
func (c *Control) SetParams(id uint32, p Params) error {
	return c.command("SET_PARAMS", uCmdSetParams, id, 0,
		func(b []byte) int { p.encode(b); return paramsSize }, nil)
}

// StartDevice makes device id's block device (START_DEV) with pid as its
// server. The kernel waits until every queue has fetched, so the queues
// must be serving.
func (c *Control) StartDevice(id uint32, pid int) error {
	return c.command("START_DEV", uCmdStartDev, id, uint64(pid), nil, nil)
}

// StopDevice removes device id's block device (STOP_DEV): its queues'
// fetches end with an abort.
func (c *Control) StopDevice(id uint32) error {
	return c.command("STOP_DEV", uCmdStopDev, id, 0, nil, nil)
}

// DeleteDevice deletes device id (DEL_DEV). The kernel waits until the
// server has closed the char device.
func (c *Control) DeleteDevice(id uint32) error {
	return c.command("DEL_DEV", uCmdDelDev, id, 0, nil, nil)
}

// UpdateSize sets device id's size in bytes while it runs (UPDATE_SIZE,
// where the device has FlagUpdateSize).
func (c *Control) UpdateSize(id uint32, size int64) error {
	return c.command("UPDATE_SIZE", uCmdUpdateSize, id, uint64(size)>>sectorShift, nil, nil)
}

// StartRecovery begins the takeover of device id, whose server died
// (START_USER_RECOVERY). The kernel refuses (EBUSY) until it has released
// the dead server's device file and quiesced the queues; StartRecovery
// retries until the timeout.
func (c *Control) StartRecovery(id uint32) error {
	deadline := c.clock.Now().Add(c.timeout)
	for {
		err := c.command("START_USER_RECOVERY", uCmdStartRecovery, id, 0, nil, nil)
		if !errors.Is(err, unix.EBUSY) || !c.clock.Now().Before(deadline) {
			return err
		}
		c.clock.Sleep(recoveryRetry)
	}
}

// EndRecovery completes the takeover with pid as the new server
// (END_USER_RECOVERY): like StartDevice it waits for every queue's fetches,
// then the kernel resends the queued requests.
func (c *Control) EndRecovery(id uint32, pid int) error {
	return c.command("END_USER_RECOVERY", uCmdEndRecovery, id, uint64(pid), nil, nil)
}

// ringRunner runs control commands on a ring of its own.
type ringRunner struct {
	r    *ring
	next uint64
	cqes []cqe
}

// cancelGrace is how long a timed-out command may take to end after its
// cancel; past it the ring is dropped (closing it cancels all).
const cancelGrace = time.Second

func newRingRunner() (*ringRunner, error) {
	// Four entries: a command and its cancel. SQE128: a control command
	// is 32 bytes.
	r, err := newRing(4, true)
	if err != nil {
		return nil, err
	}
	return &ringRunner{r: r}, nil
}

func (rr *ringRunner) close() error {
	if rr.r == nil {
		return nil
	}
	return rr.r.close()
}

func (rr *ringRunner) run(fd int, cmdOp uint32, cmd []byte, timeout time.Duration) (int32, error) {
	if rr.r == nil {
		r, err := newRing(4, true)
		if err != nil {
			return 0, err
		}
		rr.r = r
	}
	rr.next++
	ud := rr.next
	if err := rr.r.queueCmd(fd, cmdOp, cmd, ud); err != nil {
		return 0, err
	}
	if err := rr.r.submit(); err != nil {
		return 0, err
	}
	if res, ok, err := rr.await(ud, timeout); ok || err != nil {
		return res, err
	}
	// Cancel: this interrupts a command that waits in the kernel (START_DEV
	// for fetches that never come, DEL_DEV for a server that never closes).
	rr.next++
	if err := rr.r.queueCancel(ud, rr.next); err == nil {
		_ = rr.r.submit()
	}
	if _, ok, _ := rr.await(ud, cancelGrace); !ok {
		// Closing the ring makes the kernel cancel what is left on it.
		_ = rr.r.close()
		rr.r = nil
	}
	return 0, ErrTimeout
}

// await waits up to d for the completion of ud, dropping others (a late
// cancel's).
func (rr *ringRunner) await(ud uint64, d time.Duration) (int32, bool, error) {
	deadline := time.Now().Add(d)
	for {
		rr.cqes = rr.r.reap(rr.cqes[:0])
		for _, c := range rr.cqes {
			if c.userData == ud {
				return c.res, true, nil
			}
		}
		left := time.Until(deadline)
		if left <= 0 {
			return 0, false, nil
		}
		if err := rr.r.wait(left); err != nil {
			return 0, false, err
		}
	}
}
