package v1alpha1_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/berth-io/berth/api/v1alpha1"
	"github.com/berth-io/berth/internal/testenv"
	"github.com/berth-io/berth/internal/volid"
)

var (
	env   *testenv.Env
	suite = &testenv.Suite{Setup: func(e *testenv.Env) error { env = e; return nil }}
)

func TestMain(m *testing.M) { os.Exit(testenv.Main(m, suite)) }

func ctx(t *testing.T) context.Context {
	return testenv.Context(t, 30*time.Second)
}

// createAndRead creates obj, reads it back into out and deletes it.
func createAndRead(t *testing.T, obj, out client.Object) {
	t.Helper()
	if err := env.Client.Create(ctx(t), obj); err != nil {
		t.Fatalf("create %T %s: %v", obj, obj.GetName(), err)
	}
	t.Cleanup(func() { _ = env.Client.Delete(context.Background(), obj) })
	if err := env.Client.Get(ctx(t), client.ObjectKeyFromObject(obj), out); err != nil {
		t.Fatalf("get %s: %v", obj.GetName(), err)
	}
}

// mustRefuse creates obj and wants an Invalid error that mentions every want.
func mustRefuse(t *testing.T, obj client.Object, wants ...string) {
	t.Helper()
	err := env.Client.Create(ctx(t), obj)
	if err == nil {
		_ = env.Client.Delete(context.Background(), obj)
		t.Fatalf("create %s: accepted, want refused", obj.GetName())
	}
	for _, w := range wants {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("create %s: error %q does not mention %q", obj.GetName(), err, w)
		}
	}
}

func meta(name string) metav1.ObjectMeta { return metav1.ObjectMeta{Name: name} }

func TestStorageClusterDefaultsRoundTrip(t *testing.T) {
	suite.Require(t)
	var got v1.StorageCluster
	createAndRead(t, &v1.StorageCluster{ObjectMeta: meta("defaults")}, &got)
	s := got.Spec
	if s.Backend != v1.BackendLocal || s.DataDir != "/var/lib/berth" || s.Network.Provider != v1.NetworkProviderHost ||
		s.AttachmentGC.Interval == nil || s.AttachmentGC.Interval.Duration != 24*time.Hour || s.RWX.FastFailover == nil || !*s.RWX.FastFailover ||
		s.RWX.NFSGraceSeconds == nil || *s.RWX.NFSGraceSeconds != 15 || s.RWX.LeaseDurationSeconds == nil || *s.RWX.LeaseDurationSeconds != 10 || s.CleanupPolicy != v1.CleanupDetach {
		t.Errorf("defaults not applied: %+v", s)
	}
}

func TestStorageClusterMultus(t *testing.T) {
	suite.Require(t)
	var got v1.StorageCluster
	createAndRead(t, &v1.StorageCluster{ObjectMeta: meta("multus"), Spec: v1.StorageClusterSpec{
		Network:      v1.NetworkSpec{Provider: v1.NetworkProviderMultus, Selectors: &v1.NetworkSelectors{Public: "storage/public"}},
		AttachmentGC: v1.AttachmentGCSpec{Interval: &metav1.Duration{Duration: 5 * time.Second}},
	}}, &got)
	if got.Spec.Network.Selectors.ClusterNetwork() != "storage/public" {
		t.Errorf("cluster network = %q, want it to default to public", got.Spec.Network.Selectors.ClusterNetwork())
	}
	if got.Spec.AttachmentGC.Interval.Duration != 5*time.Second {
		t.Errorf("gc interval = %v", got.Spec.AttachmentGC.Interval)
	}

	mustRefuse(t, &v1.StorageCluster{ObjectMeta: meta("multus-bare"), Spec: v1.StorageClusterSpec{
		Network: v1.NetworkSpec{Provider: v1.NetworkProviderMultus},
	}}, "multus needs at least one of network.selectors.public or network.selectors.cluster")
	mustRefuse(t, &v1.StorageCluster{ObjectMeta: meta("multus-empty"), Spec: v1.StorageClusterSpec{
		Network: v1.NetworkSpec{Provider: v1.NetworkProviderMultus, Selectors: &v1.NetworkSelectors{}},
	}}, "multus needs at least one")
	mustRefuse(t, &v1.StorageCluster{ObjectMeta: meta("bad-provider"), Spec: v1.StorageClusterSpec{
		Network: v1.NetworkSpec{Provider: "calico"},
	}}, "spec.network.provider", `"host", "multus"`)
	mustRefuse(t, &v1.StorageCluster{ObjectMeta: meta("bad-gc"), Spec: v1.StorageClusterSpec{
		AttachmentGC: v1.AttachmentGCSpec{Interval: &metav1.Duration{Duration: time.Millisecond}},
	}}, "attachmentGC.interval must be at least 1s")
	mustRefuse(t, &v1.StorageCluster{ObjectMeta: meta("bad-grace"), Spec: v1.StorageClusterSpec{
		RWX: v1.RWXSpec{NFSGraceSeconds: ptr.To[int32](500)},
	}}, "spec.rwx.nfsGraceSeconds")
	mustRefuse(t, &v1.StorageCluster{ObjectMeta: meta("bad-lease"), Spec: v1.StorageClusterSpec{
		RWX: v1.RWXSpec{LeaseDurationSeconds: ptr.To[int32](1)},
	}}, "spec.rwx.leaseDurationSeconds")
	mustRefuse(t, &v1.StorageCluster{ObjectMeta: meta("bad-transport"), Spec: v1.StorageClusterSpec{
		Agent: v1.AgentSpec{UserspaceTransport: "iscsi"},
	}}, "spec.agent.userspaceTransport")
}

// TestStorageClusterUserspaceTransport: the agents' userspace transport is
// left empty by default (each agent's flag decides: an agent of an earlier
// release refuses auto, so a rollback must not find it stored), or one of
// auto, fuse, nbd and ublk; the refusal of another lists them.
func TestStorageClusterUserspaceTransport(t *testing.T) {
	suite.Require(t)
	var got v1.StorageCluster
	createAndRead(t, &v1.StorageCluster{ObjectMeta: meta("transport-default")}, &got)
	if got.Spec.Agent.UserspaceTransport != "" {
		t.Errorf("default userspaceTransport %q, want none stored", got.Spec.Agent.UserspaceTransport)
	}
	for _, tr := range []v1.UserspaceTransport{v1.TransportAuto, v1.TransportFUSE, v1.TransportNBD, v1.TransportUblk} {
		createAndRead(t, &v1.StorageCluster{ObjectMeta: meta("transport-" + string(tr)), Spec: v1.StorageClusterSpec{
			Agent: v1.AgentSpec{UserspaceTransport: tr},
		}}, &got)
		if got.Spec.Agent.UserspaceTransport != tr {
			t.Errorf("userspaceTransport %q read back as %q", tr, got.Spec.Agent.UserspaceTransport)
		}
	}
	mustRefuse(t, &v1.StorageCluster{ObjectMeta: meta("transport-iscsi"), Spec: v1.StorageClusterSpec{
		Agent: v1.AgentSpec{UserspaceTransport: "iscsi"},
	}}, "spec.agent.userspaceTransport", `"fuse", "nbd", "ublk"`)
}

// TestStorageClusterNetworkSelectors: multus selectors name
// NetworkAttachmentDefinitions as namespace/name, and only with multus.
// TestStorageClusterCSIController: replicas from 1 to 5, and more than one
// only with leader election.
func TestStorageClusterCSIController(t *testing.T) {
	suite.Require(t)
	with := func(name string, c v1.CSIControllerSpec) *v1.StorageCluster {
		return &v1.StorageCluster{ObjectMeta: meta(name), Spec: v1.StorageClusterSpec{CSIController: c}}
	}
	var got v1.StorageCluster
	createAndRead(t, with("csi-ha", v1.CSIControllerSpec{Replicas: ptr.To[int32](3)}), &got)
	if r := got.Spec.CSIController.Replicas; r == nil || *r != 3 || got.Spec.CSIController.LeaderElection != nil {
		t.Errorf("csiController %+v", got.Spec.CSIController)
	}
	createAndRead(t, with("csi-single", v1.CSIControllerSpec{Replicas: ptr.To[int32](1), LeaderElection: ptr.To(false)}), &got)
	mustRefuse(t, with("csi-alone", v1.CSIControllerSpec{Replicas: ptr.To[int32](2), LeaderElection: ptr.To(false)}),
		"csiController.replicas above 1 need leaderElection")
	mustRefuse(t, with("csi-none", v1.CSIControllerSpec{Replicas: ptr.To[int32](0)}), "spec.csiController.replicas")
	mustRefuse(t, with("csi-many", v1.CSIControllerSpec{Replicas: ptr.To[int32](6)}), "spec.csiController.replicas")
}

func TestStorageClusterNetworkSelectors(t *testing.T) {
	suite.Require(t)
	multus := func(name string, sel v1.NetworkSelectors) *v1.StorageCluster {
		return &v1.StorageCluster{ObjectMeta: meta(name), Spec: v1.StorageClusterSpec{
			Network: v1.NetworkSpec{Provider: v1.NetworkProviderMultus, Selectors: &sel},
		}}
	}
	var got v1.StorageCluster
	createAndRead(t, multus("net-both", v1.NetworkSelectors{Public: "storage/public", Cluster: "ceph-net/replication.v2"}), &got)
	if got.Spec.Network.Selectors.ClusterNetwork() != "ceph-net/replication.v2" {
		t.Errorf("cluster network = %q, want the one given", got.Spec.Network.Selectors.ClusterNetwork())
	}
	createAndRead(t, multus("net-cluster-only", v1.NetworkSelectors{Cluster: "storage/replication"}), &got)

	const want = "must be the namespace/name of a NetworkAttachmentDefinition"
	for i, bad := range []string{
		"public", "/public", "storage/", "storage/a/b", "Storage/public", "storage/Public",
		"-storage/public", "storage/public-", strings.Repeat("n", 64) + "/public",
		"storage/" + strings.Repeat("n", 254), "storage /public",
	} {
		mustRefuse(t, multus(fmt.Sprintf("net-bad-public-%d", i), v1.NetworkSelectors{Public: bad}), "spec.network.selectors.public", want)
		mustRefuse(t, multus(fmt.Sprintf("net-bad-cluster-%d", i), v1.NetworkSelectors{Public: "storage/public", Cluster: bad}), "spec.network.selectors.cluster", want)
	}
	createAndRead(t, multus("net-longest", v1.NetworkSelectors{Public: strings.Repeat("n", 63) + "/" + strings.Repeat("a", 253)}), &got)

	mustRefuse(t, &v1.StorageCluster{ObjectMeta: meta("net-host-selectors"), Spec: v1.StorageClusterSpec{
		Network: v1.NetworkSpec{Provider: v1.NetworkProviderHost, Selectors: &v1.NetworkSelectors{Public: "storage/public"}},
	}}, "network.selectors is only allowed with provider multus")
	// No provider: the default, host, takes no selectors either.
	mustRefuse(t, &v1.StorageCluster{ObjectMeta: meta("net-default-selectors"), Spec: v1.StorageClusterSpec{
		Network: v1.NetworkSpec{Selectors: &v1.NetworkSelectors{Public: "storage/public"}},
	}}, "network.selectors is only allowed with provider multus")
}

// TestStorageClusterMultusMode: the mover is off unless chosen (netns is
// the default), the mode is netns or mover, and spec.network.multus goes
// with provider multus only.
func TestStorageClusterMultusMode(t *testing.T) {
	suite.Require(t)
	multus := func(name string, m *v1.MultusSpec) *v1.StorageCluster {
		return &v1.StorageCluster{ObjectMeta: meta(name), Spec: v1.StorageClusterSpec{
			Network: v1.NetworkSpec{Provider: v1.NetworkProviderMultus, Selectors: &v1.NetworkSelectors{Public: "storage/public"}, Multus: m},
		}}
	}
	var got v1.StorageCluster
	createAndRead(t, multus("mode-unset", nil), &got)
	if got.Spec.Network.MultusMode() != v1.MultusModeNetns {
		t.Errorf("mode unset: MultusMode() = %q, want netns", got.Spec.Network.MultusMode())
	}
	createAndRead(t, multus("mode-empty", &v1.MultusSpec{}), &got)
	if got.Spec.Network.Multus == nil || got.Spec.Network.Multus.Mode != v1.MultusModeNetns {
		t.Errorf("mode defaulted to %+v, want netns", got.Spec.Network.Multus)
	}
	createAndRead(t, multus("mode-mover", &v1.MultusSpec{Mode: v1.MultusModeMover, HolderImage: "registry.example/berth:v1"}), &got)
	if got.Spec.Network.MultusMode() != v1.MultusModeMover || got.Spec.Network.Multus.HolderImage != "registry.example/berth:v1" {
		t.Errorf("mover: %+v", got.Spec.Network.Multus)
	}
	mustRefuse(t, multus("mode-bad", &v1.MultusSpec{Mode: "move"}), "spec.network.multus.mode", `"netns", "mover"`)
	mustRefuse(t, &v1.StorageCluster{ObjectMeta: meta("mode-host"), Spec: v1.StorageClusterSpec{
		Network: v1.NetworkSpec{Provider: v1.NetworkProviderHost, Multus: &v1.MultusSpec{Mode: v1.MultusModeMover}},
	}}, "network.multus is only allowed with provider multus")
}

// TestStorageClusterDataDir: the CRD refuses / and system folders as the
// data dir (the agent and keeper mount it read-write from the host), and
// the operator's and agent's check agrees with it on every case.
func TestStorageClusterDataDir(t *testing.T) {
	suite.Require(t)
	ok := []string{"/var/lib/berth", "/srv/berth", "/data", "/var/lib/berth-e2e/berth-data", "/tmp/berth-test", "/mnt/disk1/berth", "/etcetera"}
	bad := []string{"/", "/etc", "/etc/berth", "/usr", "/usr/local/berth", "/bin", "/sbin", "/lib", "/lib64/x", "/boot",
		"/dev", "/dev/shm", "/proc", "/sys/fs", "/run", "/run/berth", "/var/run", "/root", "/root/data",
		"/var/lib/kubelet", "/var/lib/kubelet/pods", "/var", "/var/lib", "/home", "/tmp",
		"relative", "/var/lib/berth/", "/var//lib/berth", "/var/lib/../../etc", "/var/lib/./berth", "/srv/berth/.."}
	for i, dir := range ok {
		var got v1.StorageCluster
		createAndRead(t, &v1.StorageCluster{ObjectMeta: meta(fmt.Sprintf("datadir-ok-%d", i)), Spec: v1.StorageClusterSpec{DataDir: dir}}, &got)
		if err := v1.ValidateDataDir(dir); err != nil {
			t.Errorf("ValidateDataDir(%q) = %v, want nil like the CRD", dir, err)
		}
	}
	for i, dir := range bad {
		mustRefuse(t, &v1.StorageCluster{ObjectMeta: meta(fmt.Sprintf("datadir-bad-%d", i)), Spec: v1.StorageClusterSpec{DataDir: dir}}, "spec.dataDir")
		if err := v1.ValidateDataDir(dir); !errors.Is(err, v1.ErrBadDataDir) {
			t.Errorf("ValidateDataDir(%q) = %v, want ErrBadDataDir like the CRD", dir, err)
		}
	}
}

func volume(name string, mut func(*v1.VolumeSpec)) *v1.Volume {
	v := &v1.Volume{ObjectMeta: meta(name), Spec: v1.VolumeSpec{StorageCluster: "default", Size: resource.MustParse("1Gi"), Node: "node-a"}}
	if mut != nil {
		mut(&v.Spec)
	}
	return v
}

func TestVolumeValidation(t *testing.T) {
	suite.Require(t)
	var got v1.Volume
	createAndRead(t, volume("vol-ok", nil), &got)
	if got.Spec.AccessMode != v1.ReadWriteOnce || got.Spec.VolumeMode != v1.VolumeModeFilesystem || got.Spec.Mounter != v1.MounterKernel {
		t.Errorf("defaults not applied: %+v", got.Spec)
	}
	got.Status = v1.VolumeStatus{State: v1.VolumeAvailable, ShareState: v1.ShareRunning, ShareEndpoint: "nfs://10.0.0.1:2049/vol-ok"}
	if err := env.Client.Status().Update(ctx(t), &got); err != nil {
		t.Fatalf("status update: %v", err)
	}

	mustRefuse(t, volume("vol-negative", func(s *v1.VolumeSpec) { s.Size = resource.MustParse("-1Gi") }), "size must be greater than zero")
	mustRefuse(t, volume("vol-zero", func(s *v1.VolumeSpec) { s.Size = resource.MustParse("0") }), "size must be greater than zero")
	mustRefuse(t, volume("vol-mode", func(s *v1.VolumeSpec) { s.AccessMode = "ReadWriteSometimes" }), "spec.accessMode", "ReadWriteOncePod")
	mustRefuse(t, volume("vol-mounter", func(s *v1.VolumeSpec) { s.Mounter = "fuse" }), "spec.mounter")
	mustRefuse(t, volume("vol-fs", func(s *v1.VolumeSpec) { s.FSType = "ntfs" }), "spec.fsType")
	mustRefuse(t, volume("vol-blockfs", func(s *v1.VolumeSpec) { s.VolumeMode = v1.VolumeModeBlock; s.FSType = "ext4" }), "fsType must be empty for Block volumes")

	got.Spec.Node = "node-b"
	if err := env.Client.Update(ctx(t), &got); err == nil || !strings.Contains(err.Error(), "node is immutable") {
		t.Errorf("moving a volume to another node: err = %v, want 'node is immutable'", err)
	}
}

func TestAttachmentValidation(t *testing.T) {
	suite.Require(t)
	var got v1.Attachment
	createAndRead(t, &v1.Attachment{ObjectMeta: meta("pvc-1"), Spec: v1.AttachmentSpec{
		AccessMode: v1.ReadWriteOnce,
		Attachments: []v1.AttachmentEntry{
			{Node: "node-a", MountDir: "/var/lib/kubelet/plugins/berth.io/pv/pvc-1/globalmount", StagingPath: "/var/lib/kubelet/plugins/berth.io/pv/pvc-1/globalmount"},
			{Node: "node-a", PodNamespace: "default", Pod: "web-0", PodUID: "u1", MountDir: "/var/lib/kubelet/pods/u1/volumes/pvc-1"},
		},
	}}, &got)
	if len(got.Spec.Attachments) != 2 || !got.Spec.Attachments[0].IsStage() || got.Spec.Attachments[1].IsStage() {
		t.Errorf("round trip: %+v", got.Spec.Attachments)
	}

	dup := v1.AttachmentEntry{Node: "node-a", Pod: "web-0", PodUID: "u1", MountDir: "/var/lib/kubelet/pods/u1/volumes/pvc-2"}
	mustRefuse(t, &v1.Attachment{ObjectMeta: meta("pvc-2"), Spec: v1.AttachmentSpec{
		AccessMode: v1.ReadWriteMany, Attachments: []v1.AttachmentEntry{dup, dup},
	}}, "Duplicate value", "spec.attachments[1]")
	mustRefuse(t, &v1.Attachment{ObjectMeta: meta("pvc-3"), Spec: v1.AttachmentSpec{AccessMode: "Sometimes"}}, "spec.accessMode")
	mustRefuse(t, &v1.Attachment{ObjectMeta: meta("pvc-4"), Spec: v1.AttachmentSpec{
		AccessMode: v1.ReadWriteOnce, Attachments: []v1.AttachmentEntry{{MountDir: "/x"}},
	}}, "spec.attachments[0].node")
}

func TestNodeCleanupRoundTrip(t *testing.T) {
	suite.Require(t)
	var got v1.NodeCleanup
	now := metav1.NewTime(time.Now().Truncate(time.Second))
	createAndRead(t, &v1.NodeCleanup{ObjectMeta: meta("node-a"), Spec: v1.NodeCleanupSpec{Entries: []v1.StaleAttachment{
		{Volume: "pvc-1", MountDir: "/m", Reason: v1.ReasonNodeOutOfService, FoundAt: now},
	}}}, &got)
	if len(got.Spec.Entries) != 1 || got.Spec.Entries[0].Reason != v1.ReasonNodeOutOfService {
		t.Errorf("round trip: %+v", got.Spec)
	}
	mustRefuse(t, &v1.NodeCleanup{ObjectMeta: meta("node-b"), Spec: v1.NodeCleanupSpec{Entries: []v1.StaleAttachment{
		{Volume: "pvc-1", MountDir: "/m", Reason: "Bored", FoundAt: now},
	}}}, "spec.entries[0].reason")
	// The pod fields follow an Attachment entry's rules (F13).
	createAndRead(t, &v1.NodeCleanup{ObjectMeta: meta("node-c"), Spec: v1.NodeCleanupSpec{Entries: []v1.StaleAttachment{
		{Volume: "pvc-1", MountDir: "/m", Pod: "default/web-0.x", PodUID: "0b5e-11", Reason: v1.ReasonPodGone, FoundAt: now},
	}}}, &got)
	for i, bad := range []v1.StaleAttachment{{Pod: "web-0"}, {Pod: "a/b/c"}, {Pod: "Default/web"}, {Pod: "ns/"}, {PodUID: "u/1"}} {
		bad.Volume, bad.MountDir, bad.Reason, bad.FoundAt = "pvc-1", "/m", v1.ReasonPodGone, now
		field := "spec.entries[0].pod"
		if bad.PodUID != "" {
			field = "spec.entries[0].podUID"
		}
		mustRefuse(t, &v1.NodeCleanup{ObjectMeta: meta(fmt.Sprintf("node-bad-%d", i)), Spec: v1.NodeCleanupSpec{Entries: []v1.StaleAttachment{bad}}}, field)
	}
}

func TestShareManagerStates(t *testing.T) {
	suite.Require(t)
	sm := &v1.ShareManager{ObjectMeta: metav1.ObjectMeta{Name: "pvc-rwx", Namespace: "default"}, Spec: v1.ShareManagerSpec{Volume: "pvc-rwx", Image: "berth:dev"}}
	var got v1.ShareManager
	createAndRead(t, sm, &got)
	got.Status = v1.ShareManagerStatus{State: v1.ShareRunning, OwnerID: "node-a", Endpoint: "nfs://10.0.0.2:2049/pvc-rwx"}
	if err := env.Client.Status().Update(ctx(t), &got); err != nil {
		t.Fatalf("status update to running: %v", err)
	}
	got.Status.State = "exploded"
	err := env.Client.Status().Update(ctx(t), &got)
	if err == nil || !strings.Contains(err.Error(), "status.state") || !strings.Contains(err.Error(), `"running"`) {
		t.Errorf("unknown state: err = %v, want a refusal naming status.state and the allowed states", err)
	}
}

// badPaths are mount dirs and staging paths the agent must never be handed:
// each is refused by the API server, naming its field.
var badPaths = map[string]string{
	"relative":       "var/lib/kubelet/pods/u1/volumes/x/y",
	"dot-dot":        "/var/lib/kubelet/pods/u1/volumes/x/../../../../../etc",
	"trailing dot":   "/var/lib/kubelet/pods/u1/volumes/x/..",
	"dot":            "/var/lib/kubelet/pods/./u1/volumes/x/y",
	"double slash":   "/var/lib/kubelet//pods/u1/volumes/x/y",
	"trailing slash": "/var/lib/kubelet/pods/u1/volumes/x/y/",
	"root":           "/",
	"too long":       "/" + strings.Repeat("a/", 512) + "b",
}

func TestAttachmentPaths(t *testing.T) {
	suite.Require(t)
	for name, p := range badPaths {
		mustRefuse(t, &v1.Attachment{ObjectMeta: meta("pvc-path"), Spec: v1.AttachmentSpec{AccessMode: v1.ReadWriteOnce,
			Attachments: []v1.AttachmentEntry{{Node: "node-a", Pod: "p", PodUID: "u1", MountDir: p}}}}, "spec.attachments[0].mountDir")
		mustRefuse(t, &v1.Attachment{ObjectMeta: meta("pvc-path"), Spec: v1.AttachmentSpec{AccessMode: v1.ReadWriteOnce,
			Attachments: []v1.AttachmentEntry{{Node: "node-a", MountDir: "/var/lib/kubelet/plugins/kubernetes.io/csi/berth.io/h/globalmount", StagingPath: p}}}},
			"spec.attachments[0].stagingPath")
		if t.Failed() {
			t.Fatalf("case %s (%q)", name, p)
		}
	}
}

func TestNodeCleanupPathsAndNames(t *testing.T) {
	suite.Require(t)
	now := metav1.NewTime(time.Now().Truncate(time.Second))
	entry := func(volume, mountDir, staging string) *v1.NodeCleanup {
		return &v1.NodeCleanup{ObjectMeta: meta("node-paths"), Spec: v1.NodeCleanupSpec{Entries: []v1.StaleAttachment{
			{Volume: volume, MountDir: mountDir, StagingPath: staging, Reason: v1.ReasonNodeGone, FoundAt: now}}}}
	}
	const good = "/var/lib/kubelet/pods/u1/volumes/kubernetes.io~csi/pvc-1/mount"
	for name, p := range badPaths {
		mustRefuse(t, entry("pvc-1", p, ""), "spec.entries[0].mountDir")
		mustRefuse(t, entry("pvc-1", good, p), "spec.entries[0].stagingPath")
		if t.Failed() {
			t.Fatalf("case %s (%q)", name, p)
		}
	}
	for _, vol := range []string{"../pvc-1", "pvc/1", "PVC-1", "pvc-1.", ".pvc", "a..b", strings.Repeat("a", 129)} {
		mustRefuse(t, entry(vol, good, ""), "spec.entries[0].volume")
		if err := volid.Valid(vol); err == nil {
			t.Errorf("volid.Valid(%q) accepted what the CRD refuses", vol)
		}
	}
	var got v1.NodeCleanup
	createAndRead(t, entry(strings.Repeat("a", 128), good, "/var/lib/kubelet/plugins/kubernetes.io/csi/berth.io/h/globalmount"), &got)
	if err := volid.Valid(got.Spec.Entries[0].Volume); err != nil {
		t.Errorf("the CRD accepted what volid.Valid refuses: %v", err)
	}
}
