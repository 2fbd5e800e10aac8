package ublk

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/berth-io/berth/internal/volerr"
)

// fakeKernel answers control commands as ublk_drv does, for the parts the
// client relies on: it reads the command and its payload where the
// command's addr points, and writes answers there.
type fakeKernel struct {
	t        *testing.T
	payload  []byte
	features uint64
	// featuresErr, when set, is GET_FEATURES' errno (an old driver).
	featuresErr unix.Errno
	devices     map[uint32]*DevInfo
	params      map[uint32][]byte
	// busy counts START_USER_RECOVERY refusals still to come (EBUSY).
	busy int
	// hang lists commands that never complete (their runner times out).
	hang map[uint32]bool
	ops  []uint32
	data []uint64
}

func (k *fakeKernel) close() error { return nil }

func (k *fakeKernel) run(fd int, op uint32, cmdBytes []byte, timeout time.Duration) (int32, error) {
	cmd, err := decodeCtrlCmd(cmdBytes)
	if err != nil {
		k.t.Fatal(err)
	}
	k.ops = append(k.ops, op)
	k.data = append(k.data, cmd.Data)
	if k.hang[op] {
		return 0, ErrTimeout
	}
	if cmd.QueueID != noQueue {
		return -int32(unix.EINVAL), nil
	}
	var buf []byte
	if cmd.Len > 0 {
		if cmd.Addr != uint64(uintptr(unsafe.Pointer(&k.payload[0]))) {
			k.t.Fatalf("command %#x: addr %#x is not the payload page", op, cmd.Addr)
		}
		buf = k.payload[:cmd.Len]
	}
	errno := func(e unix.Errno) (int32, error) { return -int32(e), nil }
	if op == uCmdGetFeatures {
		if k.featuresErr != 0 {
			return errno(k.featuresErr)
		}
		if len(buf) != featuresLen {
			return errno(unix.EINVAL)
		}
		le.PutUint64(buf, k.features)
		return 0, nil
	}
	if op == uCmdAddDev {
		info, err := DecodeDevInfo(buf)
		if err != nil || info.DevID != cmd.DevID {
			return errno(unix.EINVAL)
		}
		id := uint32(len(k.devices))
		info.DevID, info.Flags, info.ServerPID = id, info.Flags&k.features, -1
		k.devices[id] = &info
		info.encode(buf)
		return 0, nil
	}
	d := k.devices[cmd.DevID]
	if d == nil {
		return errno(unix.ENODEV)
	}
	switch op {
	case uCmdGetDevInfo:
		if len(buf) < devInfoSize {
			return errno(unix.EINVAL)
		}
		d.encode(buf)
	case uCmdSetParams:
		if len(buf) <= paramsHeader || le.Uint32(buf) > uint32(len(buf)) {
			return errno(unix.EINVAL)
		}
		k.params[cmd.DevID] = append([]byte(nil), buf...)
	case uCmdStartDev:
		if k.params[cmd.DevID] == nil || cmd.Data == 0 {
			return errno(unix.EINVAL)
		}
		d.State, d.ServerPID = StateLive, int32(cmd.Data)
	case uCmdStopDev:
		d.State = StateDead
	case uCmdDelDev:
		delete(k.devices, cmd.DevID)
	case uCmdStartRecovery:
		if d.Flags&FlagUserRecovery == 0 {
			return errno(unix.EINVAL)
		}
		if k.busy > 0 {
			k.busy--
			return errno(unix.EBUSY)
		}
	case uCmdEndRecovery:
		d.State, d.ServerPID = StateLive, int32(cmd.Data)
	default:
		return errno(unix.EOPNOTSUPP)
	}
	return 0, nil
}

// fakeClock moves only when slept on.
type fakeClock struct{ now time.Time }

func (c *fakeClock) Now() time.Time        { return c.now }
func (c *fakeClock) Sleep(d time.Duration) { c.now = c.now.Add(d) }

const allFeatures = FlagUserRecovery | FlagUserRecoveryReissue | FlagCmdIoctlEncode | FlagUnprivilegedDev

func newFakeControl(t *testing.T, features uint64) (*Control, *fakeKernel, *fakeClock) {
	t.Helper()
	payload := make([]byte, 4096)
	k := &fakeKernel{t: t, payload: payload, features: features,
		devices: map[uint32]*DevInfo{}, params: map[uint32][]byte{}, hang: map[uint32]bool{}}
	clock := &fakeClock{now: time.Unix(1000, 0)}
	return newControl(-1, k, payload, ControlConfig{Timeout: time.Second, Clock: clock}), k, clock
}

// TestControlLifecycle: add, set parameters, start, read back, stop,
// delete, each as the kernel expects it.
func TestControlLifecycle(t *testing.T) {
	c, k, _ := newFakeControl(t, allFeatures)
	f, err := c.Features()
	if err != nil || f != allFeatures {
		t.Fatalf("Features = %#x, %v", f, err)
	}
	if err := RequireRecovery(f); err != nil {
		t.Fatal(err)
	}
	info, err := c.AddDevice(DevInfo{DevID: AnyDevice, NrHWQueues: 1, QueueDepth: 64,
		MaxIOBufBytes: 512 << 10, Flags: FlagUserRecovery | FlagUserRecoveryReissue})
	if err != nil {
		t.Fatal(err)
	}
	want := FlagUserRecovery | FlagUserRecoveryReissue | FlagCmdIoctlEncode
	if info.DevID != 0 || info.Flags != want || info.QueueDepth != 64 {
		t.Errorf("AddDevice = %+v, want device 0 with flags %#x", info, want)
	}
	p := Params{LogicalBSShift: 9, PhysicalBSShift: 12, MaxSectors: 1024, DevSectors: 2048,
		DiscardGranularity: 4096, MaxDiscardSectors: 2048, MaxDiscardSegments: 1}
	if err := c.SetParams(info.DevID, p); err != nil {
		t.Fatal(err)
	}
	if got := k.params[0]; len(got) != paramsSize || le.Uint64(got[24:]) != 2048 {
		t.Errorf("kernel got params %x", got)
	}
	if err := c.StartDevice(info.DevID, 4242); err != nil {
		t.Fatal(err)
	}
	got, err := c.DeviceInfo(info.DevID)
	if err != nil || got.State != StateLive || got.ServerPID != 4242 {
		t.Errorf("DeviceInfo = %+v, %v; want live with server 4242", got, err)
	}
	if err := c.StopDevice(info.DevID); err != nil {
		t.Fatal(err)
	}
	if err := c.DeleteDevice(info.DevID); err != nil {
		t.Fatal(err)
	}
	_, err = c.DeviceInfo(info.DevID)
	if !errors.Is(err, unix.ENODEV) || !strings.Contains(err.Error(), "GET_DEV_INFO of device 0") {
		t.Errorf("info of a deleted device: %v, want ENODEV naming the command and device", err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if err := c.StopDevice(0); err == nil {
		t.Error("a command after Close succeeded")
	}
}

// TestControlRecovery: START_USER_RECOVERY is retried while the kernel
// still releases the dead server (EBUSY), within the timeout.
func TestControlRecovery(t *testing.T) {
	c, k, clock := newFakeControl(t, allFeatures)
	info, err := c.AddDevice(DevInfo{DevID: AnyDevice, NrHWQueues: 1, QueueDepth: 8,
		MaxIOBufBytes: 64 << 10, Flags: FlagUserRecovery | FlagUserRecoveryReissue})
	if err != nil {
		t.Fatal(err)
	}
	k.busy = 3
	start := clock.Now()
	if err := c.StartRecovery(info.DevID); err != nil {
		t.Fatalf("StartRecovery after 3 refusals: %v", err)
	}
	if waited := clock.Now().Sub(start); waited != 3*recoveryRetry {
		t.Errorf("waited %v, want %v", waited, 3*recoveryRetry)
	}
	if err := c.EndRecovery(info.DevID, 77); err != nil {
		t.Fatal(err)
	}
	if last := k.data[len(k.data)-1]; last != 77 {
		t.Errorf("END_USER_RECOVERY carried pid %d, want 77", last)
	}

	// Busy for longer than the timeout: EBUSY, after about the timeout.
	k.busy = 1 << 30
	start = clock.Now()
	err = c.StartRecovery(info.DevID)
	if !errors.Is(err, unix.EBUSY) {
		t.Errorf("StartRecovery on a device that stays busy: %v, want EBUSY", err)
	}
	if waited := clock.Now().Sub(start); waited < time.Second || waited > time.Second+recoveryRetry {
		t.Errorf("gave up after %v, want the 1s timeout", waited)
	}
}

func TestControlTimeout(t *testing.T) {
	c, k, _ := newFakeControl(t, allFeatures)
	k.hang[uCmdStartDev] = true
	err := c.StartDevice(3, 1)
	if !errors.Is(err, ErrTimeout) || !errors.Is(err, volerr.ErrUnavailable) {
		t.Errorf("a command that never completes: %v, want ErrTimeout (unavailable)", err)
	}
}

// TestFeaturesMissing: each kernel short of what berth needs gives an
// error that names the missing feature.
func TestFeaturesMissing(t *testing.T) {
	for _, c := range []struct {
		name     string
		features uint64
		errno    unix.Errno
		want     string
	}{
		{"no recovery", FlagCmdIoctlEncode, 0, "UBLK_F_USER_RECOVERY"},
		{"recovery without reissue", FlagCmdIoctlEncode | FlagUserRecovery, 0, "UBLK_F_USER_RECOVERY_REISSUE"},
		{"no ioctl encoding", FlagUserRecovery | FlagUserRecoveryReissue, 0, "UBLK_F_CMD_IOCTL_ENCODE"},
		{"no GET_FEATURES (before 6.5)", 0, unix.EOPNOTSUPP, "GET_FEATURES"},
	} {
		t.Run(c.name, func(t *testing.T) {
			ctl, k, _ := newFakeControl(t, c.features)
			k.featuresErr = c.errno
			f, err := ctl.Features()
			if err == nil {
				err = RequireRecovery(f)
			}
			if err == nil || !strings.Contains(err.Error(), c.want) || !errors.Is(err, volerr.ErrPrecondition) {
				t.Errorf("error %v, want a precondition naming %s", err, c.want)
			}
		})
	}
}

// TestNoUblk: where the control device is missing (this machine's
// kernel), opening it says that the kernel has no ublk driver.
func TestNoUblk(t *testing.T) {
	dev := t.TempDir()
	_, err := Probe(ControlConfig{Dev: dev})
	if !errors.Is(err, ErrNoUblk) || !errors.Is(err, volerr.ErrPrecondition) {
		t.Fatalf("Probe without a control device: %v, want ErrNoUblk", err)
	}
	for _, want := range []string{filepath.Join(dev, "ublk-control"), "CONFIG_BLK_DEV_UBLK"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not name %s", err, want)
		}
	}
	// A file that is no ublk driver: the open works, the command fails.
	if err := os.WriteFile(filepath.Join(dev, "ublk-control"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Probe(ControlConfig{Dev: dev}); err == nil {
		t.Error("Probe on a regular file succeeded")
	}
}

func TestDevicePaths(t *testing.T) {
	if got := CharPath("", 3); got != "/dev/ublkc3" {
		t.Errorf("CharPath = %s", got)
	}
	if got := BlockPath("/tmp/d", 12); got != "/tmp/d/ublkb12" {
		t.Errorf("BlockPath = %s", got)
	}
	if got := ControlPath(""); got != "/dev/ublk-control" {
		t.Errorf("ControlPath = %s", got)
	}
}

// TestRecoverRefusesAnotherVolumesDevice: a device whose tag is not the
// volume's (its number went to another volume) is never taken over.
func TestRecoverRefusesAnotherVolumesDevice(t *testing.T) {
	c, k, _ := newFakeControl(t, allFeatures)
	info, err := c.AddDevice(DevInfo{DevID: AnyDevice, NrHWQueues: 1, QueueDepth: 4, MaxIOBufBytes: 1 << 16,
		Flags: FlagUserRecovery | FlagUserRecoveryReissue, ServerFlags: Tag("node-a", "vol-2")})
	if err != nil {
		t.Fatal(err)
	}
	k.ops = nil
	_, err = Recover(t.Context(), c, info.DevID, ServerConfig{Size: 1 << 20, Tag: Tag("node-a", "vol-1")})
	if !errors.Is(err, ErrNotThisDevice) || !errors.Is(err, volerr.ErrPrecondition) {
		t.Fatalf("Recover of another volume's device: %v, want ErrNotThisDevice", err)
	}
	if len(k.ops) != 1 || k.ops[0] != uCmdGetDevInfo {
		t.Errorf("commands %#x, want only GET_DEV_INFO", k.ops)
	}
}

func TestTag(t *testing.T) {
	tags := map[uint64]string{}
	for _, nv := range [][2]string{{"a", "v"}, {"b", "v"}, {"a", "w"}, {"", "av"}, {"a", ""}} {
		tag := Tag(nv[0], nv[1])
		if tag == 0 || tags[tag] != "" {
			t.Errorf("Tag(%q, %q) = %#x: zero or shared with %s", nv[0], nv[1], tag, tags[tag])
		}
		tags[tag] = nv[0] + "/" + nv[1]
	}
	if Tag("a", "v") != Tag("a", "v") {
		t.Error("Tag is not stable")
	}
}
