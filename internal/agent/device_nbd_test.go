package agent

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	v1 "github.com/berth-io/berth/api/v1alpha1"
	"github.com/berth-io/berth/internal/blockdev/launch"
	"github.com/berth-io/berth/internal/scheme"
)

// These unit tests drive the agent's nbd transport with fakes: this kernel
// has no nbd, so the real path is tested in internal/nbd (TestKernelNBD,
// which skips here) and by the blockdev command.

// fakeNBD is the kernel nbd driver: one device per connected volume.
type fakeNBD struct {
	mu          sync.Mutex
	unavailable string
	devs        map[string]string
	disconnects int
}

func (f *fakeNBD) Available() (bool, string) { return f.unavailable == "", f.unavailable }

func (f *fakeNBD) Device(volume string) (string, bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	dev, ok := f.devs[volume]
	return dev, ok, nil
}

func (f *fakeNBD) Disconnect(volume string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.disconnects++
	delete(f.devs, volume)
	return nil
}

// fakeProcs is a /proc with the servers the fake Start made.
type fakeProcs struct {
	t       *testing.T
	root    string
	nbd     *fakeNBD
	next    int
	started []launch.Params
	stopped []int
}

type fakeServer struct {
	pid   int
	procs *fakeProcs
}

func (s fakeServer) PID() int { return s.pid }

func (s fakeServer) Stop(timeout time.Duration) error { return s.procs.stop(s.pid, timeout, nil) }

func (p *fakeProcs) add(pid int, args ...string) {
	dir := filepath.Join(p.root, strconv.Itoa(pid))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		p.t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "cmdline"), []byte(strings.Join(args, "\x00")+"\x00"), 0o644); err != nil {
		p.t.Fatal(err)
	}
}

func (p *fakeProcs) kill(pid int) { _ = os.RemoveAll(filepath.Join(p.root, strconv.Itoa(pid))) }

// start is what the real server does: connect (or reconnect) the device.
func (p *fakeProcs) start(_ context.Context, bp launch.Params) (Server, error) {
	p.next++
	pid := 1000 + p.next
	p.started = append(p.started, bp)
	p.add(pid, "/usr/bin/berth", "blockdev", "--volume", bp.Volume, "--transport", bp.Transport, "--image", bp.Image)
	p.nbd.mu.Lock()
	if _, ok := p.nbd.devs[bp.Volume]; !ok {
		p.nbd.devs[bp.Volume] = "/dev/nbd" + strconv.Itoa(len(p.nbd.devs))
	}
	p.nbd.mu.Unlock()
	return fakeServer{pid: pid, procs: p}, nil
}

func (p *fakeProcs) stop(pid int, _ time.Duration, _ func() bool) error {
	p.stopped = append(p.stopped, pid)
	p.kill(pid)
	return nil
}

func nbdAgent(t *testing.T, objs ...*v1.Volume) (*Agent, *fakeProcs, *fakeNBD) {
	t.Helper()
	s, err := scheme.New()
	if err != nil {
		t.Fatal(err)
	}
	b := fake.NewClientBuilder().WithScheme(s)
	for _, o := range objs {
		b = b.WithObjects(o)
	}
	nbd := &fakeNBD{devs: map[string]string{}}
	procs := &fakeProcs{t: t, root: t.TempDir(), nbd: nbd}
	a := newTestAgent(t, Config{API: b.Build(), Images: fakeImages{path: "/images/vol-1.img"}, Userspace: &UserspaceConfig{
		Root: t.TempDir(), Binary: "/usr/bin/berth", Keeper: &hostKeeper{}, Transport: TransportNBD, NBD: nbd,
		Start: procs.start, StopPID: procs.stop, ProcRoot: procs.root, DeadConnTimeout: time.Minute,
	}})
	return a, procs, nbd
}

func TestParseTransport(t *testing.T) {
	for in, want := range map[string]Transport{"": TransportFUSE, "fuse": TransportFUSE, "nbd": TransportNBD} {
		if got, err := ParseTransport(in); err != nil || got != want {
			t.Errorf("ParseTransport(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	if _, err := ParseTransport("iscsi"); err == nil || !strings.Contains(err.Error(), "iscsi") {
		t.Errorf("ParseTransport(iscsi) = %v, want an error naming it", err)
	}
}

func TestNBDServerFoundByRecordOrProcessTable(t *testing.T) {
	a, procs, _ := nbdAgent(t)
	procs.add(100, "berth", "blockdev", "--volume", "vol-2", "--transport", "nbd")
	procs.add(200, "berth", "blockdev", "--volume", "vol-1", "--transport", "nbd")
	procs.add(300, "berth", "blockdev", "--volume", "vol-1", "--mountpoint", "/x") // a FUSE server
	if err := os.MkdirAll(a.us.Root, 0o700); err != nil {
		t.Fatal(err)
	}
	for _, record := range []string{"", "999\n", "100\n", "garbage"} {
		// A missing, stale, foreign or broken record: the table scan finds it.
		if err := os.WriteFile(a.records().legacyNBD("vol-1"), []byte(record), 0o600); err != nil {
			t.Fatal(err)
		}
		if pid, found, err := nbdOf(a).server("vol-1"); err != nil || !found || pid != 200 {
			t.Errorf("record %q: nbdServer = %d, %t, %v; want 200", record, pid, found, err)
		}
	}
	procs.kill(200)
	if pid, found, err := nbdOf(a).server("vol-1"); err != nil || found {
		t.Errorf("after kill: nbdServer = %d, %t, %v; want none", pid, found, err)
	}
}

func TestNBDServerLifecycle(t *testing.T) {
	a, procs, nbd := nbdAgent(t)
	if _, err := nbdOf(a).ensureServer(context.Background(), "vol-1", "/images/vol-1.img"); err != nil {
		t.Fatal(err)
	}
	if len(procs.started) != 1 || procs.started[0].Transport != "nbd" || procs.started[0].DeadConnTimeout != time.Minute {
		t.Fatalf("started %+v, want one nbd server with the dead-connection timeout", procs.started)
	}
	if dev, err := nbdOf(a).device("vol-1"); err != nil || dev != "/dev/nbd0" {
		t.Fatalf("nbdDevice = %q, %v", dev, err)
	}
	// A staged volume keeps its transport whatever the agent is set to now.
	a.us.Transport = TransportFUSE
	if rec, found, err := a.records().load("vol-1"); err != nil || !found || rec.Transport != TransportNBD || rec.ServerPID != 1001 {
		t.Fatalf("staged nbd volume recorded as %+v, %t, %v; want nbd with its server's pid", rec, found, err)
	}
	if _, err := nbdOf(a).ensureServer(context.Background(), "vol-1", "/images/vol-1.img"); err != nil || len(procs.started) != 1 {
		t.Fatalf("second ensure: %v, %d starts; want no new server", err, len(procs.started))
	}
	if abnormal, msg := nbdOf(a).Condition(context.Background(), "vol-1"); abnormal {
		t.Fatalf("healthy volume abnormal: %s", msg)
	}
	if err := a.stopDevice(context.Background(), "vol-1", nbdOf(a)); err != nil {
		t.Fatal(err)
	}
	// A retry after a crash half way finds nothing more to do.
	if err := nbdOf(a).Stop(context.Background(), "vol-1"); err != nil {
		t.Fatal(err)
	}
	if nbd.disconnects != 2 || len(procs.stopped) != 1 || procs.stopped[0] != 1001 {
		t.Errorf("disconnects %d, stopped %v; want the device disconnected and server 1001 stopped once", nbd.disconnects, procs.stopped)
	}
	if _, found, err := a.records().load("vol-1"); err != nil || found {
		t.Errorf("record left after stop: %t, %v", found, err)
	}
}

func TestNBDUnavailableRefusesAndMakesNothing(t *testing.T) {
	a, procs, nbd := nbdAgent(t)
	nbd.unavailable = "/sys/module/nbd does not exist (modprobe nbd)"
	_, err := nbdOf(a).ensureServer(context.Background(), "vol-1", "/images/vol-1.img")
	if !errors.Is(err, ErrNBDUnavailable) || !errors.Is(err, ErrUnsupported) || !strings.Contains(err.Error(), "modprobe nbd") {
		t.Fatalf("err = %v, want ErrNBDUnavailable (ErrUnsupported) with the reason", err)
	}
	if _, found, _ := a.records().load("vol-1"); len(procs.started) != 0 || found {
		t.Error("a refused volume left a server or a record")
	}
}

func userspaceVolume() *v1.Volume {
	return &v1.Volume{
		ObjectMeta: metav1.ObjectMeta{Name: "vol-1"},
		Spec: v1.VolumeSpec{
			Node: "node-a", AccessMode: v1.ReadWriteOnce, VolumeMode: v1.VolumeModeFilesystem,
			Mounter: v1.MounterUserspace, FSType: "ext4",
		},
	}
}

func TestNBDHeal(t *testing.T) {
	ctx := context.Background()
	a, procs, nbd := nbdAgent(t, userspaceVolume())
	if _, err := nbdOf(a).ensureServer(ctx, "vol-1", "/images/vol-1.img"); err != nil {
		t.Fatal(err)
	}
	if _, res, err := a.Heal(ctx, "vol-1"); err != nil || res != HealServing {
		t.Fatalf("live server: Heal = %s, %v; want serving", res, err)
	}
	procs.kill(1001) // the agent's restart took the server with it
	if abnormal, msg := nbdOf(a).Condition(ctx, "vol-1"); !abnormal || !strings.Contains(msg, "healer") {
		t.Errorf("no server: condition %t %q, want abnormal naming the healer", abnormal, msg)
	}
	// A CSI call holds the volume (a stage that starts its own server):
	// the healer must not wait for it, or it would take the lock the moment
	// the call let go of it and fail kubelet's next call as busy.
	unlock, err := a.lock("vol-1")
	if err != nil {
		t.Fatal(err)
	}
	a.lockWait = time.Hour // a healer that waited would hang the test
	_, res, err := a.Heal(ctx, "vol-1")
	if res != HealBusy || !errors.Is(err, ErrBusy) {
		t.Fatalf("held lock: Heal = %s, %v; want busy", res, err)
	}
	unlock()
	if len(procs.started) != 1 {
		t.Fatalf("Heal of a held volume started a server")
	}
	if _, res, err := a.Heal(ctx, "vol-1"); err != nil || res != HealRestarted {
		t.Fatalf("dead server: Heal = %s, %v; want restarted", res, err)
	}
	if len(procs.started) != 2 || procs.started[1].Volume != "vol-1" || nbd.devs["vol-1"] != "/dev/nbd0" {
		t.Fatalf("started %+v devs %v: want a second server on the same device", procs.started, nbd.devs)
	}
	// The device is gone (disconnected behind the agent's back, or the node
	// rebooted; the kernel itself keeps it past the dead-connection
	// timeout): healing must not make a new one.
	procs.kill(1002)
	delete(nbd.devs, "vol-1")
	if _, _, err := a.Heal(ctx, "vol-1"); !errors.Is(err, ErrConnectionLost) {
		t.Fatalf("device gone: Heal err = %v, want ErrConnectionLost", err)
	}
	if len(procs.started) != 2 {
		t.Errorf("Heal started a server for a device the kernel dropped")
	}
	if abnormal, msg := nbdOf(a).Condition(ctx, "vol-1"); !abnormal || !strings.Contains(msg, "staged anew") {
		t.Errorf("device gone: condition %t %q, want abnormal telling to restage", abnormal, msg)
	}
	if err := a.prepareUnstage(ctx, "vol-1", nbdOf(a)); err != nil || len(procs.started) != 2 {
		t.Errorf("prepareUnstage of a dropped device: %v, %d starts; want nothing started", err, len(procs.started))
	}
}

func TestNBDExpandRefused(t *testing.T) {
	a, _, _ := nbdAgent(t)
	if _, err := nbdOf(a).ensureServer(context.Background(), "vol-1", "/images/vol-1.img"); err != nil {
		t.Fatal(err)
	}
	_, err := a.Expand(context.Background(), "vol-1", t.TempDir(), false)
	if !errors.Is(err, ErrUnsupported) || !strings.Contains(err.Error(), "staged again") {
		t.Fatalf("Expand err = %v, want ErrUnsupported saying when the size applies", err)
	}
	if dev, err := a.attachedDevice(context.Background(), "vol-1"); err != nil || dev != "/dev/nbd0" {
		t.Errorf("attachedDevice = %q, %v; want the nbd device", dev, err)
	}
	if err := nbdOf(a).Detach(context.Background(), "vol-1", "/dev/nbd0"); err != nil {
		t.Errorf("detach of an nbd device must be a no-op (it goes with its server): %v", err)
	}
}

// TestNBDOldLayout: a volume an agent before records staged over nbd (its
// marker <volume>.nbd holding the server's pid, and the server log) is
// found, healed (the record then takes this agent's version) and stopped
// by the upgraded agent.
func TestNBDOldLayout(t *testing.T) {
	ctx := context.Background()
	a, procs, nbd := nbdAgent(t, userspaceVolume())
	procs.add(900, "berth", "blockdev", "--volume", "vol-1", "--transport", "nbd")
	nbd.devs["vol-1"] = "/dev/nbd3"
	for name, content := range map[string]string{"vol-1.nbd": "900\n", "vol-1.log": "old server log\n"} {
		if err := os.MkdirAll(a.us.Root, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(a.us.Root, name), []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	a.us.Transport = TransportFUSE // the agent's setting of the day does not matter
	if _, res, err := a.Heal(ctx, "vol-1"); err != nil || res != HealServing {
		t.Fatalf("old server alive: Heal = %s, %v; want serving", res, err)
	}
	if dev, err := a.attachedDevice(ctx, "vol-1"); err != nil || dev != "/dev/nbd3" {
		t.Fatalf("attachedDevice = %q, %v; want the old nbd device", dev, err)
	}
	procs.kill(900)
	if _, res, err := a.Heal(ctx, "vol-1"); err != nil || res != HealRestarted {
		t.Fatalf("old server gone: Heal = %s, %v; want restarted", res, err)
	}
	rec, found, err := a.records().load("vol-1")
	if err != nil || !found || rec != (volumeRecord{Version: recordVersion, Transport: TransportNBD, ServerPID: 1001}) {
		t.Errorf("record after heal: %+v, %t, %v; want this version's, with the new server", rec, found, err)
	}
	if _, err := os.Stat(filepath.Join(a.us.Root, "vol-1.nbd")); !os.IsNotExist(err) {
		t.Errorf("old marker left beside the new record: %v", err)
	}
	d, err := a.device("vol-1")
	if err != nil {
		t.Fatal(err)
	}
	if err := a.stopDevice(ctx, "vol-1", d); err != nil {
		t.Fatal(err)
	}
	if _, found, err := a.records().load("vol-1"); err != nil || found || len(nbd.devs) != 0 {
		t.Errorf("after stop: record %t (%v), devices %v; want none", found, err, nbd.devs)
	}
}

// TestStageTransportPerCluster: the agent serves every StorageCluster, so a
// new userspace volume gets its cluster's transport (the agent's own when
// the cluster names none or has no object); a kernel volume a loop device.
func TestStageTransportPerCluster(t *testing.T) {
	a := &Agent{us: &UserspaceConfig{Root: t.TempDir(), Transport: TransportFUSE}}
	nbdCluster := &v1.StorageCluster{Spec: v1.StorageClusterSpec{Agent: v1.AgentSpec{UserspaceTransport: v1.TransportNBD}}}
	for _, tc := range []struct {
		sc   *v1.StorageCluster
		want Transport
	}{{nil, TransportFUSE}, {&v1.StorageCluster{}, TransportFUSE}, {nbdCluster, TransportNBD}} {
		if got := a.chooseTransport(userspaceVolume(), tc.sc); got != tc.want {
			t.Errorf("chooseTransport(userspace, %+v) = %s, want %s", tc.sc, got, tc.want)
		}
	}
	kernel := userspaceVolume()
	kernel.Spec.Mounter = v1.MounterKernel
	if got := a.chooseTransport(kernel, nbdCluster); got != TransportLoop {
		t.Errorf("kernel volume in an nbd cluster: %s, want loop", got)
	}
}

// nbdOf is the agent's nbd device.
func nbdOf(a *Agent) nbdDevice { return a.transports()[TransportNBD].(nbdDevice) }
