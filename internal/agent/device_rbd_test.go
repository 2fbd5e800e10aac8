package agent

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/go-logr/logr/testr"
	"google.golang.org/grpc/codes"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1 "github.com/berth-io/berth/api/v1alpha1"
	"github.com/berth-io/berth/internal/agent/errcode"
	"github.com/berth-io/berth/internal/backend"
	"github.com/berth-io/berth/internal/blockdev/launch"
	"github.com/berth-io/berth/internal/blockdev/rbdimage"
	"github.com/berth-io/berth/internal/krbd"
	"github.com/berth-io/berth/internal/volerr"
)

// Unit tests of the ceph transports with fakes; the real path (librbd in a
// blockdev server, FUSE, loop, the keeper, the healer, a real Ceph) runs in
// test/userspace (TestCephUserspaceOnRealCeph, tags ceph,pacific).

const testKey = "AQBkeykeykeykeykeykeykeykeykeykeykeyk=="

func cephCluster() *v1.StorageCluster {
	return &v1.StorageCluster{ObjectMeta: metav1.ObjectMeta{Name: "c"}, Spec: v1.StorageClusterSpec{
		Backend: v1.BackendCeph,
		Ceph: &v1.CephSpec{Monitors: []v1.CephMonitor{"127.0.0.1:3300"}, Pool: "rbd",
			SecretRef: v1.CephSecretReference{Name: "c", Namespace: "berth"}},
	}}
}

// cephStageEnv is a stage of a ceph volume (no node, status.path
// POOL/IMAGE) of mounter m, with userspace enabled.
func cephStageEnv(t *testing.T, m v1.Mounter) *stageEnv {
	t.Helper()
	e := newStageEnvOf(t, false, func(v *v1.Volume) {
		v.Spec.Node, v.Spec.Mounter = "", m
		v.Status.Path = "rbd/berth-vol-a"
	})
	if err := e.api.Create(t.Context(), cephCluster()); err != nil {
		t.Fatal(err)
	}
	// The ceph volume has no local image.
	e.cfg.Images = missingImages{}
	e.cfg.Userspace = &UserspaceConfig{Root: t.TempDir(), Keeper: &hostKeeper{},
		Start: func(context.Context, launch.Params) (Server, error) { return nil, errors.New("no server in this test") }}
	e.agent = newTestAgent(t, e.cfg)
	return e
}

// missingImages is a node with no local image.
type missingImages struct{ fakeImages }

func (missingImages) Get(_ context.Context, id string) (backend.Image, error) {
	return backend.Image{}, fmt.Errorf("image %s: %w", id, backend.ErrNotFound)
}

func (missingImages) Format(_ context.Context, id string) (backend.FormatRecord, bool, error) {
	return backend.FormatRecord{}, false, fmt.Errorf("image %s: %w", id, backend.ErrNotFound)
}

// leftNoRecord fails when the volume's record or access file is left.
func leftNoRecord(t *testing.T, e *stageEnv) {
	t.Helper()
	if _, found, err := e.agent.records().load("vol-a"); err != nil || found {
		t.Errorf("record left: %t, %v", found, err)
	}
	if _, err := os.Stat(filepath.Join(e.agent.us.Root, cephAccessDir, "vol-a.json")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("access file left: %v", err)
	}
}

func TestCephKernelVolumeRefusedBeforeAnything(t *testing.T) {
	e := cephStageEnv(t, v1.MounterKernel)
	// A kernel without the rbd driver.
	e.cfg.RBD = krbd.Bus{Root: filepath.Join(t.TempDir(), "bus", "rbd")}
	e.agent = newTestAgent(t, e.cfg)
	err := e.agent.Stage(t.Context(), StageRequest{VolumeID: "vol-a", StagingPath: e.staging,
		Secrets: map[string]string{"userID": "berth", "userKey": testKey}})
	if errcode.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "krbd") {
		t.Fatalf("stage: %v (%s), want FailedPrecondition naming krbd", err, errcode.Code(err))
	}
	e.leftNothing(t, "refused krbd stage")
	leftNoRecord(t, e)
}

func TestKRBDCheckNamesTheModule(t *testing.T) {
	bus := filepath.Join(t.TempDir(), "bus", "rbd")
	recs := records{dir: t.TempDir()}
	err := krbdDevice{bus: krbd.Bus{Root: bus}, records: recs}.Check("vol-a")
	if !errors.Is(err, ErrUnsupported) || !strings.Contains(err.Error(), "no rbd module") ||
		!strings.Contains(err.Error(), bus) || !strings.Contains(err.Error(), "mounter userspace") {
		t.Fatalf("Check without /sys/bus/rbd: %v", err)
	}
	if err := os.MkdirAll(bus, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := (krbdDevice{bus: krbd.Bus{Root: bus}, records: recs}).Check("vol-a"); err != nil {
		t.Fatalf("Check with the module: %v", err)
	}
	if err := (krbdDevice{bus: krbd.Bus{Root: bus}}).Check("vol-a"); !errors.Is(err, ErrUnsupported) {
		t.Fatalf("Check on an agent without records: %v, want refused", err)
	}
}

// Without a cephx client in the secrets (the Flexvolume path, or a class
// without the node-stage secret) a userspace ceph stage is refused, clearly,
// and leaves nothing.
func TestCephUserspaceWithoutSecretsRefused(t *testing.T) {
	e := cephStageEnv(t, v1.MounterUserspace)
	err := e.agent.Stage(t.Context(), StageRequest{VolumeID: "vol-a", StagingPath: e.staging})
	switch {
	case !rbdimage.Built:
		if errcode.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "built without the ceph backend") {
			t.Fatalf("stage on a binary without librbd: %v (%s)", err, errcode.Code(err))
		}
	case errcode.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "node-stage-secret-name") ||
		!strings.Contains(err.Error(), "Flexvolume"):
		t.Fatalf("stage without secrets: %v (%s), want InvalidArgument naming the node-stage secret", err, errcode.Code(err))
	}
	e.leftNothing(t, "refused ceph stage")
	leftNoRecord(t, e)
}

// stubDevice finds nothing and has nothing to heal.
type stubDevice struct{}

func (stubDevice) Check(string) error { return nil }
func (stubDevice) Attach(context.Context, attachRequest) (attachment, error) {
	return attachment{}, errors.New("stub")
}
func (stubDevice) Find(context.Context, string) (string, error)       { return "", nil }
func (stubDevice) Detach(context.Context, string, string) error       { return nil }
func (stubDevice) Stop(context.Context, string) error                 { return nil }
func (stubDevice) Serving(context.Context, string) (HealResult, bool) { return HealSkipped, true }
func (stubDevice) Condition(context.Context, string) (bool, string)   { return false, "" }
func (stubDevice) Heal(context.Context, string, func(context.Context) (string, error)) (HealResult, error) {
	return HealSkipped, nil
}
func (stubDevice) Expand(context.Context, string) (string, error) { return "", nil }

// innerDevice is a userspace transport that records what it was asked.
type innerDevice struct {
	stubDevice
	attached []attachRequest
	stopped  int
	healSpec string
	failWith error
}

func (*innerDevice) Check(string) error { return nil }

func (d *innerDevice) Attach(_ context.Context, r attachRequest) (attachment, error) {
	d.attached = append(d.attached, r)
	if d.failWith != nil {
		return attachment{}, d.failWith
	}
	return attachment{Device: "/dev/loop9", NewDevice: true, NewConnection: true}, nil
}

func (d *innerDevice) Stop(context.Context, string) error { d.stopped++; return nil }

func (d *innerDevice) Heal(ctx context.Context, _ string, image func(context.Context) (string, error)) (HealResult, error) {
	spec, err := image(ctx)
	d.healSpec = spec
	return HealRestarted, err
}

func rbdOf(t *testing.T, fuse *innerDevice) (rbdDevice, string) {
	t.Helper()
	root := t.TempDir()
	us := userspace{cfg: &UserspaceConfig{Root: root}, procs: &servers{}, records: records{dir: root}, log: testr.New(t)}
	return rbdDevice{userspace: us, fuse: fuse, nbd: &innerDevice{},
		via: func(*v1.StorageCluster) Transport { return TransportFUSE }}, root
}

// The key reaches the server through a 0600 file, never its arguments;
// heal finds it there, unstage removes it.
func TestRBDAccessFile(t *testing.T) {
	fuse := &innerDevice{}
	d, root := rbdOf(t, fuse)
	ctx := t.Context()
	if _, err := d.records.create("vol-a", TransportRBD); err != nil {
		t.Fatal(err)
	}
	att, err := d.Attach(ctx, attachRequest{Volume: "vol-a", Image: "rbd/berth-vol-a", Cluster: cephCluster(),
		Secrets: map[string]string{"userID": "client.berth", "userKey": testKey}})
	if err != nil || att.Device != "/dev/loop9" {
		t.Fatalf("Attach = %+v, %v", att, err)
	}
	path := filepath.Join(root, cephAccessDir, "vol-a.json")
	if len(fuse.attached) != 1 || fuse.attached[0].Image != rbdimage.Spec(path) || fuse.attached[0].Secrets != nil {
		t.Fatalf("inner transport asked %+v, want the access file's spec and no secrets", fuse.attached)
	}
	st, err := os.Stat(path)
	if err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("access file: %v, %v; want 0600", st, err)
	}
	a, err := rbdimage.Read(path)
	if err != nil || a != (rbdimage.Access{MonHost: "[v2:127.0.0.1:3300]", Client: "berth", Key: testKey, Pool: "rbd", Image: "berth-vol-a", Exclusive: true}) {
		t.Fatalf("access %v, %v", a, err)
	}
	if rec, _, _ := d.records.load("vol-a"); rec.Transport != TransportRBD || rec.Via != TransportFUSE {
		t.Errorf("record %+v, want rbd via fuse", rec)
	}
	if _, err := d.Heal(ctx, "vol-a", func(context.Context) (string, error) { return "rbd/berth-vol-a", nil }); err != nil ||
		fuse.healSpec != rbdimage.Spec(path) {
		t.Errorf("heal started with %q, %v", fuse.healSpec, err)
	}
	if err := d.Stop(ctx, "vol-a"); err != nil || fuse.stopped != 1 {
		t.Fatalf("Stop: %v, inner stops %d", err, fuse.stopped)
	}
	if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("access file left after Stop: %v", err)
	}
}

// A failed attach that made no connection takes its access file back;
// the key is in no error.
func TestRBDFailedAttachLeavesNoKey(t *testing.T) {
	fuse := &innerDevice{failWith: errors.New("blockdev server for vol-a: server failed: " + rbdimage.ErrRefused.Error())}
	d, root := rbdOf(t, fuse)
	_, err := d.Attach(t.Context(), attachRequest{Volume: "vol-a", Image: "rbd/berth-vol-a", Cluster: cephCluster(),
		Secrets: map[string]string{"userID": "berth", "userKey": testKey}})
	if errcode.Code(err) != codes.FailedPrecondition || strings.Contains(err.Error(), testKey) {
		t.Fatalf("Attach with a refused key: %v (%s), want FailedPrecondition", err, errcode.Code(err))
	}
	if _, err := os.Stat(filepath.Join(root, cephAccessDir, "vol-a.json")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("access file left: %v", err)
	}
	for _, bad := range []attachRequest{
		{Volume: "vol-a", Image: "no-pool", Cluster: cephCluster(), Secrets: map[string]string{"userID": "b", "userKey": testKey}},
		{Volume: "vol-a", Image: "rbd/x", Secrets: map[string]string{"userID": "b", "userKey": testKey}},
	} {
		if _, err := d.Attach(t.Context(), bad); err == nil || strings.Contains(err.Error(), testKey) ||
			!(errors.Is(err, volerr.ErrInvalid) || errors.Is(err, volerr.ErrPrecondition)) {
			t.Errorf("Attach(%+v) = %v", bad.Image, err)
		}
	}
}

// The Flexvolume driver gets no secrets: a ceph volume is refused by name
// before anything is made; a local one passes.
func TestFlexRefusesCephVolumes(t *testing.T) {
	e := cephStageEnv(t, v1.MounterUserspace)
	err := e.agent.refuseCephFlex(t.Context(), "vol-a")
	if errcode.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "Flexvolume") || !strings.Contains(err.Error(), "CSI") {
		t.Fatalf("refuseCephFlex = %v (%s)", err, errcode.Code(err))
	}
	local := newStageEnv(t, false)
	if err := local.agent.refuseCephFlex(t.Context(), "vol-a"); err != nil {
		t.Fatalf("local volume refused: %v", err)
	}
}

// An RBD image over nbd: the server gets the access file's spec, the
// record stays rbd (via nbd) with the server's pid, a heal starts the same
// server again, and unstage takes device, server, key file and record.
func TestRBDOverNBD(t *testing.T) {
	ctx := t.Context()
	a, procs, nbd := nbdAgent(t)
	d := a.transports()[TransportRBD].(rbdDevice)
	if _, err := a.records().create("vol-1", TransportRBD); err != nil {
		t.Fatal(err)
	}
	att, err := d.Attach(ctx, attachRequest{Volume: "vol-1", Image: "rbd/berth-vol-1", Cluster: cephCluster(),
		Secrets: map[string]string{"userID": "berth", "userKey": testKey}})
	if err != nil || att.Device != "/dev/nbd0" || !att.NewConnection {
		t.Fatalf("Attach = %+v, %v", att, err)
	}
	spec := rbdimage.Spec(d.accessPath("vol-1"))
	if len(procs.started) != 1 || procs.started[0].Image != spec || procs.started[0].Transport != "nbd" {
		t.Fatalf("started %+v, want one nbd server of %s", procs.started, spec)
	}
	wantRecord := func(pid int) {
		t.Helper()
		if rec, _, err := a.records().load("vol-1"); err != nil || rec.Transport != TransportRBD || rec.Via != TransportNBD || rec.ServerPID != pid {
			t.Fatalf("record %+v, %v; want rbd via nbd, server %d", rec, err, pid)
		}
	}
	wantRecord(1001)
	if dd, err := a.device("vol-1"); err != nil {
		t.Fatal(err)
	} else if _, ok := dd.(rbdDevice); !ok {
		t.Fatalf("staged volume's device is %T", dd)
	}
	procs.kill(1001)
	if res, err := d.Heal(ctx, "vol-1", func(context.Context) (string, error) { return "rbd/berth-vol-1", nil }); err != nil || res != HealRestarted {
		t.Fatalf("Heal = %s, %v", res, err)
	}
	if len(procs.started) != 2 || procs.started[1].Image != spec {
		t.Fatalf("healed with %+v", procs.started)
	}
	wantRecord(1002)
	if err := a.stopDevice(ctx, "vol-1", d); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(d.accessPath("vol-1")); nbd.disconnects != 1 || !errors.Is(err, os.ErrNotExist) {
		t.Errorf("after stop: %d disconnects, key file %v", nbd.disconnects, err)
	}
	if _, found, _ := a.records().load("vol-1"); found {
		t.Error("record left after stop")
	}
}

// The nbd transport is refused in the netns mode before a server starts
// or a record is written: its server sets the device up over generic
// netlink, which may not answer inside a holder's namespace.
func TestRBDOverNBDRefusedInNetns(t *testing.T) {
	a, procs, _ := nbdAgent(t)
	d := a.transports()[TransportRBD].(rbdDevice)
	sc := cephCluster()
	sc.Spec.Network = v1.NetworkSpec{Provider: v1.NetworkProviderMultus, Selectors: &v1.NetworkSelectors{Public: "default/storage"}}
	_, err := d.Attach(t.Context(), attachRequest{Volume: "vol-1", Image: "rbd/berth-vol-1", Cluster: sc,
		Secrets: map[string]string{"userID": "berth", "userKey": testKey}})
	if errcode.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "userspaceTransport") {
		t.Fatalf("Attach over nbd in the netns mode: %v, want FailedPrecondition naming the setting", err)
	}
	if len(procs.started) != 0 {
		t.Errorf("servers started: %+v", procs.started)
	}
	if _, found, _ := a.records().load("vol-1"); found {
		t.Error("record written")
	}
	if _, err := os.Stat(d.accessPath("vol-1")); err == nil {
		t.Error("access file written")
	}
}

// A stage tells the Fencer whether its volume is on Ceph: the Fencer then
// breaks no lock of a node whose Ceph clients are not recorded (it could
// not be fenced), and asks the operator for none.
func TestStageTellsTheFencerCephVolumes(t *testing.T) {
	held := errors.New("held elsewhere")
	local := newStageEnv(t, false)
	local.fence.acquireErr = held
	if err := local.stage(t); !errors.Is(err, held) {
		t.Fatalf("local stage: %v, want the fencer's error", err)
	}
	if !rbdimage.Built {
		t.Skip("the ceph stage needs librbd (tags ceph,pacific)")
	}
	e := cephStageEnv(t, v1.MounterUserspace)
	e.fence.acquireErr = held
	err := e.agent.Stage(t.Context(), StageRequest{VolumeID: "vol-a", StagingPath: e.staging, Secrets: stageSecrets})
	if !errors.Is(err, held) {
		t.Fatalf("ceph stage: %v, want the fencer's error", err)
	}
	for _, c := range []struct {
		env  *stageEnv
		ceph bool
	}{{local, false}, {e, true}} {
		if r := c.env.fence.requests; len(r) != 1 || r[0].Ceph != c.ceph {
			t.Errorf("requests %+v, want one marked ceph %t", r, c.ceph)
		}
	}
}
