package deploy_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/tools/record"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/berth-io/berth/api/v1alpha1"
	nodeagent "github.com/berth-io/berth/internal/agent"
	agentcmd "github.com/berth-io/berth/internal/cli/agent"
	"github.com/berth-io/berth/internal/fence"
)

const (
	agentUser = "system:serviceaccount:" + releaseNamespace + ":berth-agent"
	nodeExtra = "authentication.kubernetes.io/node-name"
)

// agentClient acts as the agent's service account with a token bound to a
// pod on node (none: a token that names no node).
func agentClient(t *testing.T, node string) client.Client {
	t.Helper()
	var extra []map[string][]string
	if node != "" {
		extra = append(extra, map[string][]string{nodeExtra: {node}})
	}
	c, err := client.New(impersonate(agentUser, extra...), client.Options{Scheme: env.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestAgentWritesOnlyItsOwnNodesRecords installs the chart's RBAC and
// admission policy and acts as the agent of node-a: the real fencer, stale
// lists and capacity reporter work for its own node, and every write to
// another node's records (and every write it has no business making) is
// refused by the API server.
func TestAgentWritesOnlyItsOwnNodesRecords(t *testing.T) {
	ctx := installAgentPolicy(t)
	admin := env.Client
	a, noNode := agentClient(t, "node-a"), agentClient(t, "")

	// The world: node-b holds vol-b and has a stale list; the chart's
	// StorageCluster-less install gets a berth class and a cluster.
	mustCreate := func(obj client.Object) {
		t.Helper()
		if err := admin.Create(ctx, obj); err != nil {
			t.Fatalf("create %T %s: %v", obj, obj.GetName(), err)
		}
		t.Cleanup(func() { _ = admin.Delete(context.Background(), obj) })
	}
	mustCreate(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-a"}})
	entryB := v1.AttachmentEntry{Node: "node-b", MountDir: "/var/lib/kubelet/plugins/berth.io/pv/vol-b/globalmount"}
	mustCreate(&v1.Attachment{ObjectMeta: metav1.ObjectMeta{Name: "vol-b"},
		Spec: v1.AttachmentSpec{AccessMode: v1.ReadWriteOnce, Attachments: []v1.AttachmentEntry{entryB}}})
	mustCreate(&v1.NodeCleanup{ObjectMeta: metav1.ObjectMeta{Name: "node-b"}, Spec: v1.NodeCleanupSpec{Entries: []v1.StaleAttachment{
		{Volume: "vol-x", MountDir: "/var/lib/kubelet/pods/u1/volumes/x", Reason: v1.ReasonPodGone, FoundAt: metav1.Now()},
	}}})
	for _, n := range []string{"a", "b"} {
		mustCreate(&v1.Volume{ObjectMeta: metav1.ObjectMeta{Name: "local-" + n, Labels: map[string]string{v1.NodeLabel: "node-" + n}},
			Spec: v1.VolumeSpec{StorageCluster: "berth", Size: resource.MustParse("1Gi"), Node: "node-" + n}})
	}
	// A ceph volume: no node, any node's agent may stage it.
	mustCreate(&v1.Volume{ObjectMeta: metav1.ObjectMeta{Name: "ceph-x"},
		Spec: v1.VolumeSpec{StorageCluster: "berth", Size: resource.MustParse("1Gi")}})
	mustCreate(&v1.StorageCluster{ObjectMeta: metav1.ObjectMeta{Name: "vap"}})
	class := &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: "berth"}, Provisioner: v1.DriverName,
		Parameters: map[string]string{v1.ParamStorageCluster: "berth"}}
	mustCreate(class)
	mustCreate(&storagev1.CSIStorageCapacity{ObjectMeta: metav1.ObjectMeta{Name: "cap-b", Namespace: releaseNamespace,
		Labels: map[string]string{v1.NodeLabel: "node-b"}},
		NodeTopology: &metav1.LabelSelector{MatchLabels: map[string]string{v1.TopologyNodeKey: "node-b"}}, StorageClassName: "berth",
		Capacity: resource.NewQuantity(1<<30, resource.BinarySI)})

	refused := func(what string, err error, policy bool) {
		t.Helper()
		switch {
		case policy && !isPolicyDenial(err):
			t.Errorf("%s: %v, want refused by the admission policy", what, err)
		case !policy && !apierrors.IsForbidden(err):
			t.Errorf("%s: %v, want Forbidden by RBAC", what, err)
		default:
			t.Logf("%s: refused: %v", what, err)
		}
	}
	allowed := func(what string, err error) {
		t.Helper()
		if err != nil {
			t.Errorf("%s: %v, want allowed", what, err)
		}
	}

	// Nodes and pods are no longer the agent's to patch or list.
	nodePatch := client.RawPatch(types.MergePatchType, []byte(`{"metadata":{"annotations":{"x":"y"}}}`))
	refused("patch own Node", a.Patch(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-a"}}, nodePatch), false)
	refused("list pods", a.List(ctx, &corev1.PodList{}), false)
	refused("update StorageCluster spec", a.Update(ctx, get(ctx, t, &v1.StorageCluster{ObjectMeta: metav1.ObjectMeta{Name: "vap"}})), false)

	// Attachments of other nodes.
	att := get(ctx, t, &v1.Attachment{ObjectMeta: metav1.ObjectMeta{Name: "vol-b"}})
	changed := att.DeepCopy()
	changed.Spec.Attachments[0].StagingPath = "/elsewhere"
	refused("change node-b's entry", a.Update(ctx, changed), true)
	dropped := att.DeepCopy()
	dropped.Spec.Attachments = nil
	refused("drop node-b's entry without taking over", a.Update(ctx, dropped), true)
	refused("delete node-b's Attachment (the GC's work)", a.Delete(ctx, att.DeepCopy()), true)
	mode := att.DeepCopy()
	mode.Spec.AccessMode = v1.ReadWriteMany
	mode.Spec.Attachments = append(mode.Spec.Attachments, v1.AttachmentEntry{Node: "node-a", MountDir: "/var/lib/kubelet/plugins/berth.io/pv/vol-b/globalmount"})
	refused("widen the access mode beside node-b's hold", a.Update(ctx, mode), true)

	// Attachment metadata (F4): no finalizer that keeps it, no annotation,
	// no hiding node-b's holds by taking its label off.
	held := get(ctx, t, &v1.Attachment{ObjectMeta: metav1.ObjectMeta{Name: "vol-b"}})
	held.Labels = map[string]string{fence.NodeLabelKey("node-b"): "true", fence.LabeledLabel: "true"}
	if err := admin.Update(ctx, held); err != nil {
		t.Fatal(err)
	}
	fin := get(ctx, t, &v1.Attachment{ObjectMeta: metav1.ObjectMeta{Name: "vol-b"}})
	fin.Finalizers = []string{"x.io/hold"}
	refused("add a finalizer to node-b's Attachment", a.Update(ctx, fin), true)
	ann := get(ctx, t, &v1.Attachment{ObjectMeta: metav1.ObjectMeta{Name: "vol-b"}})
	ann.Annotations = map[string]string{"x": "y"}
	refused("annotate node-b's Attachment", a.Update(ctx, ann), true)
	hidden := get(ctx, t, &v1.Attachment{ObjectMeta: metav1.ObjectMeta{Name: "vol-b"}})
	delete(hidden.Labels, fence.NodeLabelKey("node-b"))
	refused("take node-b's label off while it holds the volume", a.Update(ctx, hidden), true)

	// A deleting Attachment (kept by someone's finalizer) takes no entry.
	dying := &v1.Attachment{ObjectMeta: metav1.ObjectMeta{Name: "vol-dying", Finalizers: []string{"x.io/hold"}},
		Spec: v1.AttachmentSpec{AccessMode: v1.ReadWriteMany, Attachments: []v1.AttachmentEntry{entryB}}}
	mustCreate(dying)
	t.Cleanup(func() {
		d := get(context.Background(), t, &v1.Attachment{ObjectMeta: metav1.ObjectMeta{Name: "vol-dying"}})
		d.Finalizers = nil
		_ = admin.Update(context.Background(), d)
	})
	if err := admin.Delete(ctx, dying.DeepCopy()); err != nil {
		t.Fatal(err)
	}
	reuse := get(ctx, t, &v1.Attachment{ObjectMeta: metav1.ObjectMeta{Name: "vol-dying"}})
	reuse.Spec.Attachments = append(reuse.Spec.Attachments, v1.AttachmentEntry{Node: "node-a", MountDir: "/var/lib/kubelet/plugins/berth.io/pv/vol-dying/globalmount"})
	refused("add an entry to a deleting Attachment", a.Update(ctx, reuse), true)

	// NodeCleanup of another node: no removing, no status.
	nc := get(ctx, t, &v1.NodeCleanup{ObjectMeta: metav1.ObjectMeta{Name: "node-b"}})
	emptied := nc.DeepCopy()
	emptied.Spec.Entries = nil
	refused("empty node-b's stale list", a.Update(ctx, emptied), true)
	st := nc.DeepCopy()
	st.Status.Pending = 7
	refused("write node-b's cleanup status", a.Status().Update(ctx, st), true)

	// Volumes of other nodes, and moving one's own away.
	vb := get(ctx, t, &v1.Volume{ObjectMeta: metav1.ObjectMeta{Name: "local-b"}})
	vb.Status.State = v1.VolumeAvailable
	refused("status of node-b's Volume", a.Status().Update(ctx, vb), true)
	va := get(ctx, t, &v1.Volume{ObjectMeta: metav1.ObjectMeta{Name: "local-a"}})
	moved := va.DeepCopy()
	moved.Labels[v1.NodeLabel] = "node-b"
	refused("relabel own Volume to node-b", a.Update(ctx, moved), true)
	// A node-less Volume's status stays closed to agents, status.formatted
	// too: its format record is its RBD image's metadata (the agent writes
	// none there, see internal/agent/format.go).
	vc := get(ctx, t, &v1.Volume{ObjectMeta: metav1.ObjectMeta{Name: "ceph-x"}})
	vc.Status.Formatted = &v1.VolumeFormat{FSType: "ext4", Time: metav1.Now()}
	refused("status.formatted of a node-less Volume", a.Status().Update(ctx, vc), true)

	// StorageCluster status: nothing but its own node in cleanedNodes.
	sc := get(ctx, t, &v1.StorageCluster{ObjectMeta: metav1.ObjectMeta{Name: "vap"}})
	other := sc.DeepCopy()
	other.Status.CleanedNodes = []string{"node-b"}
	refused("report node-b cleaned", a.Status().Update(ctx, other), true)
	phase := sc.DeepCopy()
	phase.Status.Phase = v1.StorageClusterReady
	refused("set the StorageCluster phase", a.Status().Update(ctx, phase), true)

	// Capacity of another node.
	capB := get(ctx, t, &storagev1.CSIStorageCapacity{ObjectMeta: metav1.ObjectMeta{Name: "cap-b", Namespace: releaseNamespace}})
	capB.Capacity = resource.NewQuantity(1<<40, resource.BinarySI)
	refused("update node-b's capacity", a.Update(ctx, capB), true)
	refused("create a capacity of node-b", a.Create(ctx, &storagev1.CSIStorageCapacity{
		ObjectMeta:   metav1.ObjectMeta{Name: "cap-b2", Namespace: releaseNamespace, Labels: map[string]string{v1.NodeLabel: "node-a"}},
		NodeTopology: &metav1.LabelSelector{MatchLabels: map[string]string{v1.TopologyNodeKey: "node-b"}}, StorageClassName: "berth",
	}), true)

	// A token that names no node writes nothing.
	refused("write without a node-bound token", noNode.Create(ctx, &v1.Attachment{ObjectMeta: metav1.ObjectMeta{Name: "nonode"},
		Spec: v1.AttachmentSpec{AccessMode: v1.ReadWriteOnce, Attachments: []v1.AttachmentEntry{{Node: "node-a", MountDir: "/m"}}}}), true)

	// Its own node's records, through the agent's real code.
	fencer := fence.New(a, record.NewFakeRecorder(100), clock.RealClock{}, logr.Discard(), fence.Options{})
	own := fence.Request{Volume: "vol-a", Node: "node-a", MountDir: "/var/lib/kubelet/plugins/berth.io/pv/vol-a/globalmount", AccessMode: v1.ReadWriteOnce}
	allowed("acquire own stage hold", fencer.Acquire(ctx, own))
	allowed("release own hold (deletes the Attachment)", fencer.Release(ctx, "vol-a", "node-a", own.MountDir))
	// node-b's Node object is gone. node-a's agent may not break node-b's
	// hold itself (F4): not by hand, not by writing node-b's stale list or
	// a request in node-b's name.
	takeover := fence.Request{Volume: "vol-b", Node: "node-a", MountDir: "/var/lib/kubelet/plugins/berth.io/pv/vol-b/globalmount", AccessMode: v1.ReadWriteOnce}
	byHand := get(ctx, t, &v1.Attachment{ObjectMeta: metav1.ObjectMeta{Name: "vol-b"}})
	byHand.Spec.Attachments = []v1.AttachmentEntry{{Node: "node-a", MountDir: takeover.MountDir}}
	refused("take vol-b over by hand", a.Update(ctx, byHand), true)
	staleB := get(ctx, t, &v1.NodeCleanup{ObjectMeta: metav1.ObjectMeta{Name: "node-b"}})
	staleB.Spec.Entries = append(staleB.Spec.Entries, v1.StaleAttachment{Volume: "vol-b", MountDir: entryB.MountDir,
		Reason: v1.ReasonNodeGone, FoundAt: metav1.Now()})
	refused("add to node-b's stale list", a.Update(ctx, staleB), true)
	refused("create node-c's stale list", a.Create(ctx, &v1.NodeCleanup{ObjectMeta: metav1.ObjectMeta{Name: "node-c"}}), true)
	forged := get(ctx, t, &v1.Attachment{ObjectMeta: metav1.ObjectMeta{Name: "vol-b"}})
	forged.Spec.TakeOvers = []v1.TakeOverRequest{{AttachmentEntry: v1.AttachmentEntry{Node: "node-c", MountDir: takeover.MountDir},
		AccessMode: v1.ReadWriteOnce, RequestedAt: metav1.Now()}}
	refused("ask a take-over in node-c's name", a.Update(ctx, forged), true)
	// It asks (a request of its own node), and the operator, whose
	// Fencer reads the Node itself, moves node-b's entry to node-b's
	// stale list; the agent's Acquire then takes the volume.
	asking := fence.New(a, record.NewFakeRecorder(100), clock.RealClock{}, logr.Discard(), fence.Options{AskOperator: true})
	acquired := make(chan error, 1)
	go func() { acquired <- asking.Acquire(ctx, takeover) }()
	operator := fence.New(admin, record.NewFakeRecorder(100), clock.RealClock{}, logr.Discard(), fence.Options{})
	var takeErr error
	for served := false; !served; {
		select {
		case takeErr = <-acquired:
			served = true
		case <-time.After(200 * time.Millisecond):
			if _, err := operator.ServeTakeOvers(ctx, "vol-b", nil); err != nil {
				t.Fatalf("operator serves take-overs: %v", err)
			}
		}
	}
	allowed("take over vol-b from the gone node-b through the operator", takeErr)
	if nc := get(ctx, t, &v1.NodeCleanup{ObjectMeta: metav1.ObjectMeta{Name: "node-b"}}); len(nc.Spec.Entries) != 2 {
		t.Errorf("node-b's stale list after the take-over: %+v, want vol-x and vol-b", nc.Spec.Entries)
	}
	if got := get(ctx, t, &v1.Attachment{ObjectMeta: metav1.ObjectMeta{Name: "vol-b"}}); len(got.Spec.TakeOvers) != 0 || got.Spec.Holders != "node-a" {
		t.Errorf("vol-b after the take-over: holders %q, requests %+v; want node-a and none", got.Spec.Holders, got.Spec.TakeOvers)
	}
	allowed("release vol-b", fencer.Release(ctx, "vol-b", "node-a", takeover.MountDir))

	// Attachment status: node-b's entry stays node-b's while node-b holds
	// the volume; node-a writes its own through the agent's real code.
	shared := &v1.Attachment{ObjectMeta: metav1.ObjectMeta{Name: "vol-s"}, Spec: v1.AttachmentSpec{AccessMode: v1.ReadWriteMany,
		Attachments: []v1.AttachmentEntry{entryB, {Node: "node-a", MountDir: "/var/lib/kubelet/plugins/berth.io/pv/vol-s/globalmount"}}}}
	mustCreate(shared)
	shared.Status.Nodes = []v1.AttachmentNodeStatus{{Node: "node-b", DevicePath: "/dev/loop7", Staged: true}}
	if err := admin.Status().Update(ctx, shared); err != nil {
		t.Fatal(err)
	}
	bStatus := get(ctx, t, &v1.Attachment{ObjectMeta: metav1.ObjectMeta{Name: "vol-s"}})
	bStatus.Status.Nodes[0].DevicePath = "/dev/loop8"
	refused("change node-b's status entry", a.Status().Update(ctx, bStatus), true)
	bStatus.Status.Nodes = nil
	refused("drop node-b's status entry while node-b holds the volume", a.Status().Update(ctx, bStatus), true)
	allowed("report own staged device", fencer.ReportStaged(ctx, "vol-s", fence.Staged{Node: "node-a", DevicePath: "/dev/loop3"}))
	if got := get(ctx, t, &v1.Attachment{ObjectMeta: metav1.ObjectMeta{Name: "vol-s"}}); got.Status.Devices != "node-a=/dev/loop3, node-b=/dev/loop7" {
		t.Errorf("devices after own report: %q", got.Status.Devices)
	}
	released := get(ctx, t, &v1.Attachment{ObjectMeta: metav1.ObjectMeta{Name: "vol-s"}})
	released.Spec.Attachments = released.Spec.Attachments[1:] // node-b let go (the admin plays its agent)
	if err := admin.Update(ctx, released); err != nil {
		t.Fatal(err)
	}
	allowed("clear own entry, dropping that of node-b, which holds nothing now",
		fencer.ReportStaged(ctx, "vol-s", fence.Staged{Node: "node-a"}))
	if got := get(ctx, t, &v1.Attachment{ObjectMeta: metav1.ObjectMeta{Name: "vol-s"}}); len(got.Status.Nodes) != 0 || got.Status.Devices != "" {
		t.Errorf("status after unstage: %+v", got.Status)
	}

	// Fenced Ceph clients are the operator's (F5): an agent that listed
	// node-c's fenced client on its own list would have the operator lift
	// that fence once node-a is clean.
	nodeCClient := v1.BlocklistedClient{Address: "10.0.0.3:0/7", Volume: "vol-c", Reason: v1.ReasonNodeGone, BlocklistedAt: metav1.Now()}
	refused("create own stale list with another node's fenced client", a.Create(ctx, &v1.NodeCleanup{
		ObjectMeta: metav1.ObjectMeta{Name: "node-a"}, Spec: v1.NodeCleanupSpec{Blocklisted: []v1.BlocklistedClient{nodeCClient}}}), true)
	ownNC := &v1.NodeCleanup{ObjectMeta: metav1.ObjectMeta{Name: "node-a"}}
	allowed("create own stale list", a.Create(ctx, ownNC))
	t.Cleanup(func() { _ = admin.Delete(context.Background(), ownNC) })
	ownNC.Status.Pending = 1
	allowed("write own cleanup status", a.Status().Update(ctx, ownNC))
	// The operator fences one of node-a's clients (a lock break).
	fenced := get(ctx, t, &v1.NodeCleanup{ObjectMeta: metav1.ObjectMeta{Name: "node-a"}})
	fenced.Spec.Blocklisted = []v1.BlocklistedClient{{Address: "10.0.0.9:0/1", Volume: "vol-c", Reason: v1.ReasonNodeGone, BlocklistedAt: metav1.Now()}}
	if err := admin.Update(ctx, fenced); err != nil {
		t.Fatal(err)
	}
	added := get(ctx, t, &v1.NodeCleanup{ObjectMeta: metav1.ObjectMeta{Name: "node-a"}})
	added.Spec.Blocklisted = append(added.Spec.Blocklisted, nodeCClient)
	refused("add another node's fenced client to its own list", a.Update(ctx, added), true)
	kept := get(ctx, t, &v1.NodeCleanup{ObjectMeta: metav1.ObjectMeta{Name: "node-a"}})
	kept.Spec.Entries = nil
	allowed("update own list, fenced clients kept", a.Update(ctx, kept))
	// Nor does an agent take a client off, or set a clean-since mark, either
	// of which would have the operator lift a blocklist entry.
	unfenced := get(ctx, t, &v1.NodeCleanup{ObjectMeta: metav1.ObjectMeta{Name: "node-a"}})
	unfenced.Spec.Blocklisted = nil
	refused("take a fenced client off its own list", a.Update(ctx, unfenced), true)
	for _, name := range []string{"node-a", "node-b"} {
		marked := get(ctx, t, &v1.NodeCleanup{ObjectMeta: metav1.ObjectMeta{Name: name}})
		marked.Annotations = map[string]string{fence.NodeCleanSinceAnnotation: "2000-01-01T00:00:00Z"}
		refused("mark "+name+" clean since 2000", a.Update(ctx, marked), true)
	}

	va = get(ctx, t, &v1.Volume{ObjectMeta: metav1.ObjectMeta{Name: "local-a"}})
	va.Status.State = v1.VolumeAvailable
	allowed("status of own Volume", a.Status().Update(ctx, va))

	sc = get(ctx, t, &v1.StorageCluster{ObjectMeta: metav1.ObjectMeta{Name: "vap"}})
	sc.Status.CleanedNodes = append(sc.Status.CleanedNodes, "node-a")
	allowed("report own node cleaned", a.Status().Update(ctx, sc))

	// Node status: only the Flexvolume driver's condition of its own Node,
	// through the agent's real code; kubelet's conditions and the Node's
	// addresses stay kubelet's.
	mustCreate(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-d"}})
	flexFailed := &corev1.NodeCondition{Status: corev1.ConditionFalse, Reason: "InstallFailed", Message: "read-only file system"}
	ownFlex := agentcmd.NodeCondition{Client: a, Node: "node-a", Type: agentcmd.FlexvolumeCondition}
	allowed("write own Node's Flexvolume condition", ownFlex.Set(ctx, flexFailed))
	allowed("remove own Node's Flexvolume condition", ownFlex.Set(ctx, nil))
	refused("write node-d's Flexvolume condition",
		agentcmd.NodeCondition{Client: a, Node: "node-d", Type: agentcmd.FlexvolumeCondition}.Set(ctx, flexFailed), true)
	refused("write own Node's Ready condition", agentcmd.NodeCondition{Client: a, Node: "node-a", Type: corev1.NodeReady}.Set(ctx,
		&corev1.NodeCondition{Status: corev1.ConditionFalse, Reason: "Forged"}), true)
	addresses := client.RawPatch(types.StrategicMergePatchType, []byte(`{"status":{"addresses":[{"type":"InternalIP","address":"10.9.9.9"}]}}`))
	refused("change own Node's addresses", a.Status().Patch(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-a"}}, addresses), true)

	// Pods: it deletes only those on its own node (F8).
	for _, n := range []string{"a", "b"} {
		mustCreate(&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "web-" + n, Namespace: "default"},
			Spec: corev1.PodSpec{NodeName: "node-" + n, Containers: []corev1.Container{{Name: "c", Image: "busybox"}}}})
	}
	refused("delete a pod on node-b", a.Delete(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "web-b", Namespace: "default"}}), true)
	allowed("delete a pod on its own node", a.Delete(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "web-a", Namespace: "default"}}))

	rep := &nodeagent.CapacityReporter{Client: a, Node: "node-a", Namespace: releaseNamespace, Log: logr.Discard(),
		Free: func(context.Context, string) (int64, error) { return 5 << 30, nil }}
	allowed("publish own capacity", rep.Report(ctx))
	rep.Free = func(context.Context, string) (int64, error) { return 4 << 30, nil }
	allowed("update own capacity", rep.Report(ctx))
	got := get(ctx, t, &storagev1.CSIStorageCapacity{ObjectMeta: metav1.ObjectMeta{Name: nodeagent.CapacityName("node-a", "berth"), Namespace: releaseNamespace}})
	if got.Capacity.Value() != 4<<30 || got.NodeTopology.MatchLabels[v1.TopologyNodeKey] != "node-a" || got.StorageClassName != "berth" {
		t.Errorf("published capacity: %+v", got)
	}
	t.Cleanup(func() { _ = admin.Delete(context.Background(), got) })
}

// installAgentPolicy applies the chart (CRDs, RBAC, admission policies)
// and waits until the API server enforces the agent's policy. The test
// has three minutes, the returned context's.
func installAgentPolicy(t *testing.T) context.Context {
	t.Helper()
	suite.Require(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	t.Cleanup(cancel)
	out := template(t, "--include-crds", "--set", "namespace.create=true")
	_, kinds := apply(ctx, t, out)
	// The agent's and the share manager's.
	if kinds["ValidatingAdmissionPolicy"] != 2 || kinds["ValidatingAdmissionPolicyBinding"] != 2 {
		t.Fatalf("chart rendered %v, want two ValidatingAdmissionPolicies and their bindings", kinds)
	}
	waitCRDs(ctx, t)
	// The policy is picked up a moment after it is created.
	a := agentClient(t, "node-a")
	forged := &v1.Attachment{ObjectMeta: metav1.ObjectMeta{Name: "forged"},
		Spec: v1.AttachmentSpec{AccessMode: v1.ReadWriteOnce, Attachments: []v1.AttachmentEntry{{Node: "node-b", MountDir: "/m"}}}}
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		err := a.Create(ctx, forged.DeepCopy())
		if err == nil {
			_ = env.Client.Delete(ctx, forged.DeepCopy())
		}
		return isPolicyDenial(err), nil
	})
	if err != nil {
		t.Fatalf("agent of node-a creating an Attachment entry of node-b: not refused by the admission policy (is ValidatingAdmissionPolicy enabled?): %v", err)
	}
	return ctx
}

// isPolicyDenial tells whether err is a refusal by one of the rules of
// berth's admission policy (not a rule that failed to evaluate).
func isPolicyDenial(err error) bool {
	return err != nil && strings.Contains(err.Error(), "ValidatingAdmissionPolicy 'berth-agent-own-node'") &&
		!strings.Contains(err.Error(), "resulted in error")
}

// get reads obj's current state as the admin.
func get[T client.Object](ctx context.Context, t *testing.T, obj T) T {
	t.Helper()
	if err := env.Client.Get(ctx, client.ObjectKeyFromObject(obj), obj); err != nil {
		t.Fatalf("get %T %s: %v", obj, obj.GetName(), err)
	}
	return obj
}
