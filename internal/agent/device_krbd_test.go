package agent

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	v1 "github.com/berth-io/berth/api/v1alpha1"
	"github.com/berth-io/berth/internal/krbd"
)

// krbdOf is a krbd device on a bus folder of the test's: the kernel's
// mappings are folders the test makes.
func krbdOf(t *testing.T) (krbdDevice, string) {
	t.Helper()
	bus := filepath.Join(t.TempDir(), "rbd")
	if err := os.MkdirAll(filepath.Join(bus, "devices"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"add_single_major", "remove_single_major"} {
		if err := os.WriteFile(filepath.Join(bus, f), nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return krbdDevice{bus: krbd.Bus{Root: bus, Block: blockOf(bus)}, records: records{dir: t.TempDir()}}, bus
}

// blockOf is the block device folder beside a test's bus folder.
func blockOf(bus string) string { return filepath.Join(filepath.Dir(bus), "block") }

// setReadOnly sets the read-only flag of mapping id.
func setReadOnly(t *testing.T, bus, id string, ro bool) {
	t.Helper()
	dir := filepath.Join(blockOf(bus), "rbd"+id)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	v := "0\n"
	if ro {
		v = "1\n"
	}
	if err := os.WriteFile(filepath.Join(dir, "ro"), []byte(v), 0o644); err != nil {
		t.Fatal(err)
	}
}

func mapInKernel(t *testing.T, bus, id, pool, image, client string) {
	t.Helper()
	dir := filepath.Join(bus, "devices", id)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, v := range map[string]string{"pool": pool, "name": image, "current_snap": "-", "client_addr": client} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(v+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	setReadOnly(t, bus, id, false)
}

// An agent that stopped between the kernel's map and its record finds the
// mapping by the recorded image, reports its own client for fencing, and
// unmaps it by its number; once gone, the device is reported gone.
func TestKRBDFindsMappingAfterRestart(t *testing.T) {
	d, bus := krbdOf(t)
	ctx := t.Context()
	if err := d.records.save("vol-a", volumeRecord{Transport: TransportKRBD, RBD: "berth/pvc-a"}); err != nil {
		t.Fatal(err)
	}
	if dev, err := d.Find(ctx, "vol-a"); err != nil || dev != "" {
		t.Fatalf("Find before any mapping = %q, %v", dev, err)
	}
	mapInKernel(t, bus, "3", "berth", "pvc-b", "10.0.0.9:0/1")
	mapInKernel(t, bus, "5", "berth", "pvc-a", "10.0.0.9:0/42")
	att, err := d.Attach(ctx, attachRequest{Volume: "vol-a", Image: "berth/pvc-a", Cluster: cephCluster(),
		Secrets: map[string]string{"userID": "berth", "userKey": testKey}})
	if err != nil || att.Device != "/dev/rbd5" || att.NewDevice || att.NewConnection {
		t.Fatalf("Attach of a mapped image = %+v, %v; want rbd5, nothing new", att, err)
	}
	if got, _ := os.ReadFile(filepath.Join(bus, "add_single_major")); len(got) != 0 {
		t.Errorf("mapped again: %q", got)
	}
	if dev, err := d.Find(ctx, "vol-a"); err != nil || dev != "/dev/rbd5" {
		t.Errorf("Find = %q, %v", dev, err)
	}
	if addrs, err := d.cephClients("vol-a"); err != nil || len(addrs) != 1 || addrs[0] != "10.0.0.9:0/42" {
		t.Errorf("cephClients = %v, %v", addrs, err)
	}
	if err := d.Detach(ctx, "vol-a", "/dev/rbd5"); err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(filepath.Join(bus, "remove_single_major")); string(got) != "5" {
		t.Errorf("unmap request %q, want 5", got)
	}
	// The kernel's mapping gone under a recorded device (a reboot).
	id := 5
	if err := d.records.save("vol-a", volumeRecord{Transport: TransportKRBD, RBD: "berth/pvc-a", RBDDevice: &id}); err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(filepath.Join(bus, "devices", "5")); err != nil {
		t.Fatal(err)
	}
	if abnormal, msg := d.Condition(ctx, "vol-a"); !abnormal || !strings.Contains(msg, "rbd5 is gone") {
		t.Errorf("Condition after the mapping went = %t, %q", abnormal, msg)
	}
	if err := d.Stop(ctx, "vol-a"); err != nil {
		t.Errorf("Stop with nothing mapped: %v", err)
	}
}

// A stage request without the cephx client maps nothing.
func TestKRBDWithoutSecretsMapsNothing(t *testing.T) {
	d, bus := krbdOf(t)
	if _, err := d.Attach(t.Context(), attachRequest{Volume: "vol-a", Image: "berth/pvc-a", Cluster: cephCluster()}); err == nil ||
		!strings.Contains(err.Error(), "node-stage-secret-name") {
		t.Fatalf("Attach without secrets: %v", err)
	}
	if got, _ := os.ReadFile(filepath.Join(bus, "add_single_major")); len(got) != 0 {
		t.Errorf("mapped: %q", got)
	}
}

// Two mappings of the image and no recorded number: which one the volume
// uses is not known, and nothing is unmapped on a guess. A device given
// by path is unmapped when it maps the volume's image.
func TestKRBDTwoMappingsOfTheImage(t *testing.T) {
	d, bus := krbdOf(t)
	ctx := t.Context()
	if err := d.records.save("vol-a", volumeRecord{Transport: TransportKRBD, RBD: "berth/pvc-a"}); err != nil {
		t.Fatal(err)
	}
	mapInKernel(t, bus, "1", "berth", "pvc-a", "10.0.0.9:0/1")
	mapInKernel(t, bus, "2", "berth", "pvc-a", "10.0.0.9:0/2")
	mapInKernel(t, bus, "3", "berth", "pvc-b", "10.0.0.9:0/3")
	if dev, err := d.Find(ctx, "vol-a"); err == nil || !strings.Contains(err.Error(), "more than once") {
		t.Fatalf("Find with two mappings = %q, %v; want an error", dev, err)
	}
	if err := d.Detach(ctx, "vol-a", "/dev/rbd3"); err == nil {
		t.Fatal("Detach of another image's device by path went on to guess")
	}
	if got, _ := os.ReadFile(filepath.Join(bus, "remove_single_major")); len(got) != 0 {
		t.Fatalf("unmapped %q", got)
	}
	if err := d.Detach(ctx, "vol-a", "/dev/rbd2"); err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(filepath.Join(bus, "remove_single_major")); string(got) != "2" {
		t.Errorf("unmap request %q, want 2", got)
	}
}

// A map whose outcome is not known (the kernel took the request, no new
// device found) fails the stage but keeps the record, so the next stage
// or unstage finds the device should it appear.
func TestKRBDStageWithUnknownOutcomeKeepsRecord(t *testing.T) {
	e := cephStageEnv(t, v1.MounterKernel)
	d, _ := krbdOf(t)
	e.cfg.RBD = d.bus
	e.agent = newTestAgent(t, e.cfg)
	err := e.agent.Stage(t.Context(), StageRequest{VolumeID: "vol-a", StagingPath: e.staging,
		Secrets: map[string]string{"userID": "berth", "userKey": testKey}})
	if !errors.Is(err, krbd.ErrPending) {
		t.Fatalf("stage: %v, want the outcome unknown", err)
	}
	rec, found, err := e.agent.records().load("vol-a")
	if err != nil || !found || rec.Transport != TransportKRBD || rec.RBD != "rbd/berth-vol-a" {
		t.Errorf("record after an unknown outcome: %+v, %t, %v", rec, found, err)
	}
}

// A mapping left read-only by an earlier stage is unmapped and mapped
// again for a read-write one, never handed over (every write would fail
// EROFS); one of the asked kind is reused as it is.
func TestKRBDMappingOfTheOtherAccessIsRemade(t *testing.T) {
	d, bus := krbdOf(t)
	ctx := t.Context()
	five := 5
	if err := d.records.save("vol-a", volumeRecord{Transport: TransportKRBD, RBD: "rbd/berth-vol-a", RBDDevice: &five}); err != nil {
		t.Fatal(err)
	}
	mapInKernel(t, bus, "5", "rbd", "berth-vol-a", "10.0.0.9:0/42")
	setReadOnly(t, bus, "5", true)
	secrets := map[string]string{"userID": "berth", "userKey": testKey}
	att, err := d.Attach(ctx, attachRequest{Volume: "vol-a", Image: "rbd/berth-vol-a", Cluster: cephCluster(), Secrets: secrets, ReadOnly: true})
	if err != nil || att.Device != "/dev/rbd5" || att.NewDevice {
		t.Fatalf("read-only Attach of a read-only mapping = %+v, %v; want rbd5 reused", att, err)
	}
	if got, _ := os.ReadFile(filepath.Join(bus, "remove_single_major")); len(got) != 0 {
		t.Fatalf("unmapped %q", got)
	}
	_, err = d.Attach(ctx, attachRequest{Volume: "vol-a", Image: "rbd/berth-vol-a", Cluster: cephCluster(), Secrets: secrets})
	if !errors.Is(err, krbd.ErrPending) {
		t.Fatalf("read-write Attach of a read-only mapping: %v; want it unmapped and mapped again (no new device here)", err)
	}
	if got, _ := os.ReadFile(filepath.Join(bus, "remove_single_major")); string(got) != "5" {
		t.Errorf("unmap request %q, want 5", got)
	}
	req, _ := os.ReadFile(filepath.Join(bus, "add_single_major"))
	if !strings.Contains(string(req), " rbd berth-vol-a -") || strings.Contains(string(req), "read_only") {
		t.Errorf("map request %q: want the image, read-write", req)
	}
}
