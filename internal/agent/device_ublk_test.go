package agent

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"

	"google.golang.org/grpc/codes"

	v1 "github.com/berth-io/berth/api/v1alpha1"
	"github.com/berth-io/berth/internal/agent/errcode"
	"github.com/berth-io/berth/internal/blockdev/launch"
	"github.com/berth-io/berth/internal/blockdev/ublk"
)

// These unit tests drive the agent's ublk transport with fakes: this
// kernel has no ublk, so the real path is tested in internal/blockdev/ublk
// and internal/cli/blockdev (root tests that skip here).

// fakeUblk is the kernel ublk driver: devices by number, each marked
// with the tag of the server that added it.
type fakeUblk struct {
	mu       sync.Mutex
	probeErr error
	devs     map[uint32]*ublk.DevInfo
	next     uint32
	stops    []uint32
	deletes  []uint32
	sizes    map[uint32]int64
	// updateSize: devices get UBLK_F_UPDATE_SIZE.
	updateSize bool
}

func newFakeUblk() *fakeUblk {
	return &fakeUblk{devs: map[uint32]*ublk.DevInfo{}, sizes: map[uint32]int64{}}
}

func (k *fakeUblk) Probe() error { return k.probeErr }

func (k *fakeUblk) Device(id uint32) (ublk.DevInfo, bool, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if d, ok := k.devs[id]; ok {
		return *d, true, nil
	}
	return ublk.DevInfo{}, false, nil
}

func (k *fakeUblk) Find(tag uint64) (ublk.DevInfo, bool, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	for _, d := range k.devs {
		if d.ServerFlags == tag {
			return *d, true, nil
		}
	}
	return ublk.DevInfo{}, false, nil
}

func (k *fakeUblk) Stop(id uint32) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	if d, ok := k.devs[id]; ok {
		k.stops = append(k.stops, id)
		d.State = ublk.StateDead
	}
	return nil
}

func (k *fakeUblk) Delete(id uint32) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	if _, ok := k.devs[id]; ok {
		k.deletes = append(k.deletes, id)
		delete(k.devs, id)
	}
	return nil
}

func (k *fakeUblk) UpdateSize(id uint32, size int64) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	if d, ok := k.devs[id]; !ok || d.Flags&ublk.FlagUpdateSize == 0 {
		return fmt.Errorf("device %d: %w", id, ublk.ErrNoUpdateSize)
	}
	k.sizes[id] = size
	return nil
}

// ublkServer is a started server that tells its device, as launch.Process
// does from the ready line.
type ublkServer struct {
	fakeServer
	dev string
}

func (s ublkServer) Device() string { return s.dev }

// start is what the real server does: add a device marked with its tag,
// or recover the one it is given, which must carry that tag.
func (k *fakeUblk) start(p *fakeProcs) func(context.Context, launch.Params) (Server, error) {
	return func(_ context.Context, bp launch.Params) (Server, error) {
		k.mu.Lock()
		defer k.mu.Unlock()
		tag := ublk.Tag(bp.Node, bp.Volume)
		id := k.next
		if bp.UblkRecover != nil {
			id = *bp.UblkRecover
			if d := k.devs[id]; d == nil || d.ServerFlags != tag {
				return nil, fmt.Errorf("recover device %d: %w", id, ublk.ErrNotThisDevice)
			}
		} else {
			k.next++
			flags := ublk.FlagUserRecovery | ublk.FlagUserRecoveryReissue
			if k.updateSize {
				flags |= ublk.FlagUpdateSize
			}
			k.devs[id] = &ublk.DevInfo{DevID: id, Flags: flags, ServerFlags: tag}
		}
		k.devs[id].State = ublk.StateLive
		p.next++
		pid := 1000 + p.next
		p.started = append(p.started, bp)
		p.add(pid, "/usr/bin/berth", "blockdev", "--transport", bp.Transport, "--volume", bp.Volume, "--image", bp.Image)
		return ublkServer{fakeServer: fakeServer{pid: pid, procs: p}, dev: ublk.BlockPath("", id)}, nil
	}
}

// died is the server's death: the kernel keeps the device, quiesced.
func (k *fakeUblk) died(p *fakeProcs, pid int, id uint32) {
	p.kill(pid)
	k.mu.Lock()
	defer k.mu.Unlock()
	k.devs[id].State = ublk.StateQuiesced
}

func ublkAgent(t *testing.T, objs ...*v1.Volume) (*Agent, *fakeProcs, *fakeUblk) {
	t.Helper()
	k := newFakeUblk()
	procs := &fakeProcs{t: t, root: t.TempDir()}
	api := fakeAPI(t)
	for _, o := range objs {
		api = api.WithObjects(o)
	}
	a := newTestAgent(t, Config{API: api.Build(), Images: fakeImages{path: "/images/vol-1.img"},
		Userspace: &UserspaceConfig{Root: t.TempDir(), Binary: "/usr/bin/berth", Keeper: &hostKeeper{}, Transport: TransportUblk,
			Ublk: k, Start: k.start(procs), StopPID: procs.stop, ProcRoot: procs.root}})
	return a, procs, k
}

// ublkOf is the agent's ublk device.
func ublkOf(a *Agent) ublkDevice { return a.transports()[TransportUblk].(ublkDevice) }

func attachUblk(t *testing.T, a *Agent) attachment {
	t.Helper()
	if _, err := a.records().create("vol-1", TransportUblk); err != nil {
		t.Fatal(err)
	}
	att, err := ublkOf(a).Attach(t.Context(), attachRequest{Volume: "vol-1", Image: "/images/vol-1.img"})
	if err != nil {
		t.Fatal(err)
	}
	return att
}

func TestParseTransportUblk(t *testing.T) {
	if got, err := ParseTransport("ublk"); err != nil || got != TransportUblk {
		t.Errorf("ParseTransport(ublk) = %q, %v", got, err)
	}
	if _, err := ParseTransport("iscsi"); err == nil || !strings.Contains(err.Error(), "ublk") {
		t.Errorf("ParseTransport(iscsi) = %v, want the transports named", err)
	}
	a := &Agent{us: &UserspaceConfig{Root: t.TempDir(), Transport: TransportFUSE}}
	sc := &v1.StorageCluster{Spec: v1.StorageClusterSpec{Agent: v1.AgentSpec{UserspaceTransport: v1.TransportUblk}}}
	if got := a.chooseTransport(userspaceVolume(), sc); got != TransportUblk {
		t.Errorf("chooseTransport in a ublk cluster = %s", got)
	}
	if got := a.chooseTransport(userspaceVolume(), nil); got != TransportFUSE {
		t.Errorf("the default transport changed: %s", got)
	}
}

// TestUblkUnavailableRefusedWithTheFeature: a kernel without ublk, or
// without its user recovery, is refused at stage naming the feature, as a
// FailedPrecondition, before a fence, server or record is made.
func TestUblkUnavailableRefusedWithTheFeature(t *testing.T) {
	for missing, feature := range map[error]string{ublk.ErrNoUblk: "CONFIG_BLK_DEV_UBLK", ublk.ErrNoRecovery: "UBLK_F_USER_RECOVERY"} {
		e := newStageEnvOf(t, false, func(v *v1.Volume) { v.Spec.Mounter = v1.MounterUserspace })
		k := newFakeUblk()
		k.probeErr = fmt.Errorf("ublk: probe: %w", missing)
		procs := &fakeProcs{t: t, root: t.TempDir()}
		e.cfg.Userspace = &UserspaceConfig{Root: t.TempDir(), Binary: "/usr/bin/berth", Keeper: &hostKeeper{},
			Transport: TransportUblk, Ublk: k, Start: k.start(procs), StopPID: procs.stop, ProcRoot: procs.root}
		e.agent = newTestAgent(t, e.cfg)
		err := e.refused(t, ErrUblkUnavailable, 0)
		if !errors.Is(err, missing) || !errors.Is(err, ErrUnsupported) || errcode.Code(err) != codes.FailedPrecondition {
			t.Errorf("stage: %v (%s), want ErrUblkUnavailable wrapping %v, FailedPrecondition", err, errcode.Code(err), missing)
		}
		if !strings.Contains(err.Error(), feature) {
			t.Errorf("refusal %q does not name %s", err, feature)
		}
		if _, found, _ := e.agent.records().load("vol-a"); len(procs.started) != 0 || found || len(k.devs) != 0 {
			t.Error("a refused stage left a server, a record or a device")
		}
	}
}

func TestUblkServerLifecycle(t *testing.T) {
	ctx := t.Context()
	a, procs, k := ublkAgent(t)
	att := attachUblk(t, a)
	if !att.NewConnection || att.Device != "/dev/ublkb0" {
		t.Fatalf("Attach = %+v, want a new connection on /dev/ublkb0", att)
	}
	if len(procs.started) != 1 || procs.started[0].UblkRecover != nil || procs.started[0].Node != "node-a" {
		t.Fatalf("started %+v, want one server adding a device, with the node", procs.started)
	}
	rec, found, err := a.records().load("vol-1")
	if err != nil || !found || rec.Transport != TransportUblk || rec.ServerPID != 1001 || rec.UblkDevice == nil || *rec.UblkDevice != 0 {
		t.Fatalf("record %+v, %t, %v; want ublk with the server's pid and device", rec, found, err)
	}
	// A repeated stage finds it all.
	again, err := ublkOf(a).Attach(ctx, attachRequest{Volume: "vol-1", Image: "/images/vol-1.img"})
	if err != nil || again.NewConnection || again.Device != "/dev/ublkb0" || len(procs.started) != 1 {
		t.Fatalf("second Attach = %+v, %v, %d starts; want the same device, no new server", again, err, len(procs.started))
	}
	if abnormal, msg := ublkOf(a).Condition(ctx, "vol-1"); abnormal {
		t.Fatalf("healthy volume abnormal: %s", msg)
	}
	if dev, err := a.attachedDevice(ctx, "vol-1"); err != nil || dev != "/dev/ublkb0" {
		t.Errorf("attachedDevice = %q, %v", dev, err)
	}
	if err := a.stopDevice(ctx, "vol-1", ublkOf(a)); err != nil {
		t.Fatal(err)
	}
	if err := ublkOf(a).Stop(ctx, "vol-1"); err != nil {
		t.Fatalf("a second Stop: %v", err)
	}
	if len(k.stops) != 1 || len(k.deletes) != 1 || len(k.devs) != 0 || len(procs.stopped) != 1 || procs.stopped[0] != 1001 {
		t.Errorf("stops %v, deletes %v, devices %v, servers stopped %v; want device 0 stopped and deleted, server 1001 stopped, once",
			k.stops, k.deletes, k.devs, procs.stopped)
	}
	if _, found, err := a.records().load("vol-1"); err != nil || found {
		t.Errorf("record left after stop: %t, %v", found, err)
	}
}

func TestUblkHealRecoversTheKeptDevice(t *testing.T) {
	ctx := t.Context()
	a, procs, k := ublkAgent(t, userspaceVolume())
	attachUblk(t, a)
	if _, res, err := a.Heal(ctx, "vol-1"); err != nil || res != HealServing {
		t.Fatalf("live server: Heal = %s, %v; want serving", res, err)
	}
	k.died(procs, 1001, 0) // the agent's restart took the server with it
	if abnormal, msg := ublkOf(a).Condition(ctx, "vol-1"); !abnormal || !strings.Contains(msg, "healer") {
		t.Errorf("no server: condition %t %q, want abnormal naming the healer", abnormal, msg)
	}
	if _, res, err := a.Heal(ctx, "vol-1"); err != nil || res != HealRestarted {
		t.Fatalf("dead server: Heal = %s, %v; want restarted", res, err)
	}
	if len(procs.started) != 2 || procs.started[1].UblkRecover == nil || *procs.started[1].UblkRecover != 0 || len(k.devs) != 1 {
		t.Fatalf("started %+v, devices %v: want a second server recovering device 0", procs.started, k.devs)
	}
	if rec, _, _ := a.records().load("vol-1"); rec.ServerPID != 1002 || rec.UblkDevice == nil || *rec.UblkDevice != 0 {
		t.Errorf("record after heal %+v, want the new server on device 0", rec)
	}

	// The device is gone (deleted behind the agent's back, or the node
	// rebooted): healing must not add a new, empty one.
	procs.kill(1002)
	_ = k.Delete(0)
	if _, _, err := a.Heal(ctx, "vol-1"); !errors.Is(err, ErrConnectionLost) {
		t.Fatalf("device gone: Heal err = %v, want ErrConnectionLost", err)
	}
	if abnormal, msg := ublkOf(a).Condition(ctx, "vol-1"); !abnormal || !strings.Contains(msg, "staged anew") {
		t.Errorf("device gone: condition %t %q, want abnormal telling to restage", abnormal, msg)
	}
	if err := a.prepareUnstage(ctx, "vol-1", ublkOf(a)); err != nil || len(procs.started) != 2 {
		t.Errorf("prepareUnstage of a lost device: %v, %d starts; want nothing started", err, len(procs.started))
	}
}

// TestUblkDeviceNumberOfAnotherVolume: the number the record names went
// to another volume (a reboot, or another node on this kernel): it is
// neither healed nor stopped as this volume's.
func TestUblkDeviceNumberOfAnotherVolume(t *testing.T) {
	ctx := t.Context()
	a, procs, k := ublkAgent(t, userspaceVolume())
	attachUblk(t, a)
	k.died(procs, 1001, 0)
	k.devs[0].ServerFlags = ublk.Tag("node-b", "vol-1")
	if _, _, err := a.Heal(ctx, "vol-1"); !errors.Is(err, ErrConnectionLost) {
		t.Fatalf("Heal with another volume's device: %v, want ErrConnectionLost", err)
	}
	if err := ublkOf(a).Stop(ctx, "vol-1"); err != nil || len(k.stops) != 0 || len(k.deletes) != 0 {
		t.Errorf("Stop: %v, stops %v, deletes %v; want the other volume's device left alone", err, k.stops, k.deletes)
	}
}

// TestUblkDeviceFoundByTag: a crash between the server's start and its
// record: the device is found by its tag, the server by its command line.
func TestUblkDeviceFoundByTag(t *testing.T) {
	ctx := t.Context()
	a, procs, k := ublkAgent(t, userspaceVolume())
	k.next = 4
	attachUblk(t, a)
	if err := a.records().save("vol-1", volumeRecord{Transport: TransportUblk}); err != nil {
		t.Fatal(err)
	}
	if dev, err := ublkOf(a).Find(ctx, "vol-1"); err != nil || dev != "/dev/ublkb4" {
		t.Fatalf("Find = %q, %v; want /dev/ublkb4 by its tag", dev, err)
	}
	if _, res, err := a.Heal(ctx, "vol-1"); err != nil || res != HealServing {
		t.Errorf("Heal = %s, %v; want the running server found", res, err)
	}
	k.died(procs, 1001, 4)
	if _, res, err := a.Heal(ctx, "vol-1"); err != nil || res != HealRestarted || *procs.started[1].UblkRecover != 4 {
		t.Errorf("Heal = %s, %v; want device 4 recovered", res, err)
	}
}

func TestUblkExpand(t *testing.T) {
	ctx := t.Context()
	a, _, k := ublkAgent(t)
	attachUblk(t, a)
	// Device 0 was added without UBLK_F_UPDATE_SIZE (an older kernel).
	_, err := a.Expand(ctx, "vol-1", t.TempDir(), true)
	if !errors.Is(err, ErrUnsupported) || !errors.Is(err, ublk.ErrNoUpdateSize) || !strings.Contains(err.Error(), "staged again") ||
		errcode.Code(err) != codes.FailedPrecondition {
		t.Fatalf("Expand without UPDATE_SIZE: %v, want ErrUnsupported saying when the size applies", err)
	}
	k.devs[0].Flags |= ublk.FlagUpdateSize
	if size, err := a.Expand(ctx, "vol-1", "", true); err != nil || size != 64<<20 || k.sizes[0] != 64<<20 {
		t.Fatalf("Expand = %d, %v (device size %d); want the image's size", size, err, k.sizes[0])
	}
}

// TestRBDOverUblk: a ceph volume staged over ublk keeps its transport rbd
// and its via, with the server's pid and device.
func TestRBDOverUblk(t *testing.T) {
	a, procs, _ := ublkAgent(t)
	d := a.transports()[TransportRBD].(rbdDevice)
	if err := a.records().save("vol-1", volumeRecord{Transport: TransportRBD, Via: TransportUblk}); err != nil {
		t.Fatal(err)
	}
	in, err := d.inner("vol-1")
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := in.(ublkDevice); !ok {
		t.Fatalf("inner transport %T, want ublk", in)
	}
	if err := ublkOf(a).startServer(t.Context(), "vol-1", "rbd:/access.json", nil); err != nil {
		t.Fatal(err)
	}
	rec, _, err := a.records().load("vol-1")
	if err != nil || rec.Transport != TransportRBD || rec.Via != TransportUblk || rec.ServerPID != 1001 ||
		rec.UblkDevice == nil || *rec.UblkDevice != 0 {
		t.Errorf("record %+v, %v; want rbd via ublk with its server and device", rec, err)
	}
	if procs.started[0].Transport != "ublk" {
		t.Errorf("started %+v", procs.started)
	}
}

// TestAutoTransport: auto, the default, stages over ublk where the kernel
// serves ublk with user recovery and over fuse where it does not, whether
// the StorageCluster or the agent's flag says auto; a named transport is
// kept as named.
func TestAutoTransport(t *testing.T) {
	for _, tc := range []struct {
		probe error
		agent Transport
		sc    v1.UserspaceTransport
		want  Transport
	}{
		{nil, TransportAuto, "", TransportUblk},
		{ublk.ErrNoUblk, TransportAuto, "", TransportFUSE},
		{ublk.ErrNoRecovery, TransportFUSE, v1.TransportAuto, TransportFUSE},
		{nil, TransportFUSE, v1.TransportAuto, TransportUblk},
		{nil, TransportAuto, v1.TransportFUSE, TransportFUSE},
		{nil, TransportAuto, v1.TransportNBD, TransportNBD},
	} {
		a := &Agent{us: &UserspaceConfig{Root: t.TempDir(), Transport: tc.agent, Ublk: &fakeUblk{probeErr: tc.probe}}}
		sc := &v1.StorageCluster{Spec: v1.StorageClusterSpec{Agent: v1.AgentSpec{UserspaceTransport: tc.sc}}}
		if got := a.chooseTransport(userspaceVolume(), sc); got != tc.want {
			t.Errorf("probe %v, agent %s, cluster %q: %s, want %s", tc.probe, tc.agent, tc.sc, got, tc.want)
		}
	}
	if got, err := ParseTransport("auto"); err != nil || got != TransportAuto {
		t.Errorf("ParseTransport(auto) = %q, %v", got, err)
	}
}
