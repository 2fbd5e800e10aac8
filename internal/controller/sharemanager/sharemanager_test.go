package sharemanager_test

import (
	"context"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/berth-io/berth/api/v1alpha1"
	"github.com/berth-io/berth/internal/controller/sharemanager"
	"github.com/berth-io/berth/internal/testenv"
	"github.com/berth-io/berth/internal/volid"
)

// newVolume makes a StorageCluster with the given rwx settings and a Volume
// in it, both removed at the end of the test.
func newVolume(t *testing.T, name string, mode v1.VolumeMode, node string, rwx v1.RWXSpec) *v1.Volume {
	t.Helper()
	return newVolumeIn(t, name, mode, node, v1.StorageClusterSpec{RWX: rwx})
}

// newVolumeIn is newVolume in a StorageCluster of spec.
func newVolumeIn(t *testing.T, name string, mode v1.VolumeMode, node string, spec v1.StorageClusterSpec) *v1.Volume {
	t.Helper()
	ctx := testCtx(t)
	sc := &v1.StorageCluster{ObjectMeta: metav1.ObjectMeta{Name: "sc-" + name}, Spec: spec}
	vol := &v1.Volume{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: v1.VolumeSpec{
		StorageCluster: sc.Name, Size: resource.MustParse("1Gi"), AccessMode: v1.ReadWriteMany, VolumeMode: mode, Node: node,
	}}
	for _, o := range []client.Object{sc, vol} {
		if err := env.Client.Create(ctx, o); err != nil {
			t.Fatalf("create %T: %v", o, err)
		}
	}
	t.Cleanup(func() {
		ctx := context.Background()
		// envtest runs no garbage collector: remove what the Volume owns.
		_ = env.Client.Delete(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: sharemanager.Name(name), Namespace: namespace}}, client.GracePeriodSeconds(0))
		_ = env.Client.Delete(ctx, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: sharemanager.Name(name), Namespace: namespace}})
		// The API server adds the storage-protection finalizers; no
		// controller here would ever remove them.
		for _, o := range []client.Object{
			&corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: sharemanager.Name(name), Namespace: namespace}},
			&corev1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: sharemanager.Name(name)}},
		} {
			_ = env.Client.Patch(ctx, o, client.RawPatch(types.MergePatchType, []byte(`{"metadata":{"finalizers":null}}`)))
			_ = env.Client.Delete(ctx, o)
		}
		_ = env.Client.Delete(ctx, &v1.Attachment{ObjectMeta: metav1.ObjectMeta{Name: name}})
		_ = env.Client.Delete(ctx, vol)
		_ = env.Client.Delete(ctx, sc)
		_ = env.Client.Delete(ctx, &v1.ShareManager{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace}})
	})
	return vol
}

// useVolume records (or, with no pod, removes) a workload pod's entry in
// the volume's Attachment, as the CSI node service does.
func useVolume(t *testing.T, volume, pod string) {
	t.Helper()
	ctx := testCtx(t)
	att := &v1.Attachment{ObjectMeta: metav1.ObjectMeta{Name: volume}}
	err := env.Client.Get(ctx, client.ObjectKeyFromObject(att), att)
	if apierrors.IsNotFound(err) {
		att.Spec.AccessMode = v1.ReadWriteMany
		err = env.Client.Create(ctx, att)
	}
	if err != nil {
		t.Fatalf("attachment: %v", err)
	}
	att.Spec.Attachments = nil
	if pod != "" {
		att.Spec.Attachments = []v1.AttachmentEntry{
			{Node: "node-w", MountDir: "/var/lib/kubelet/plugins/berth.io/" + volume},
			{Node: "node-w", PodNamespace: "default", Pod: pod, PodUID: "uid-" + pod, MountDir: "/var/lib/kubelet/pods/uid-" + pod + "/volumes/" + volume},
		}
	}
	if err := env.Client.Update(ctx, att); err != nil {
		t.Fatalf("update attachment: %v", err)
	}
}

// stateRecorder keeps every state a ShareManager went through, from a
// watch on the API server: each status write is one event, so no
// transition is missed however fast the controller moves on.
type stateRecorder struct {
	mu     sync.Mutex
	states []v1.ShareState
}

func recordStates(t *testing.T, name string) *stateRecorder {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	wc, err := client.NewWithWatch(env.Config, client.Options{Scheme: env.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	w, err := wc.Watch(ctx, &v1.ShareManagerList{}, client.InNamespace(namespace), client.MatchingFields{"metadata.name": name})
	if err != nil {
		cancel()
		t.Fatalf("watch sharemanagers: %v", err)
	}
	rec := &stateRecorder{}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ev := range w.ResultChan() {
			sm, ok := ev.Object.(*v1.ShareManager)
			if !ok || sm.Status.State == "" {
				continue
			}
			rec.mu.Lock()
			if n := len(rec.states); n == 0 || rec.states[n-1] != sm.Status.State {
				rec.states = append(rec.states, sm.Status.State)
			}
			rec.mu.Unlock()
		}
	}()
	t.Cleanup(func() { w.Stop(); cancel(); <-done })
	return rec
}

func (r *stateRecorder) get() []v1.ShareState {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]v1.ShareState(nil), r.states...)
}

// waitShare waits until the ShareManager and its Volume both show state.
func waitShare(t *testing.T, volume string, state v1.ShareState) *v1.ShareManager {
	t.Helper()
	sm := &v1.ShareManager{}
	testenv.Eventually(t, waitLimit, "share "+volume+" "+string(state), func(ctx context.Context) (bool, error) {
		vol := &v1.Volume{}
		if err := env.Client.Get(ctx, client.ObjectKey{Name: volume}, vol); err != nil {
			return false, err
		}
		if err := env.Client.Get(ctx, client.ObjectKey{Namespace: namespace, Name: volume}, sm); err != nil {
			return false, err
		}
		return sm.Status.State == state && vol.Status.ShareState == state && vol.Status.ShareEndpoint == sm.Status.Endpoint, nil
	})
	return sm
}

// sharePod waits for a share-manager pod other than the one with UID not.
func sharePod(t *testing.T, volume string, not types.UID) *corev1.Pod {
	t.Helper()
	pod := &corev1.Pod{}
	testenv.Eventually(t, waitLimit, "share-manager pod of "+volume, func(ctx context.Context) (bool, error) {
		err := env.Client.Get(ctx, client.ObjectKey{Namespace: namespace, Name: sharemanager.Name(volume)}, pod)
		return err == nil && pod.UID != not && pod.DeletionTimestamp.IsZero(), client.IgnoreNotFound(err)
	})
	return pod
}

// kubelet plays the parts the API server leaves to the scheduler and the
// kubelet: it binds the pod to a node and writes its status.
type kubelet struct{ t *testing.T }

func (k kubelet) bind(pod *corev1.Pod, node string) {
	k.t.Helper()
	b := &corev1.Binding{ObjectMeta: metav1.ObjectMeta{Name: pod.Name, Namespace: pod.Namespace},
		Target: corev1.ObjectReference{Kind: "Node", Name: node}}
	if err := env.Client.SubResource("binding").Create(testCtx(k.t), pod, b); err != nil {
		k.t.Fatalf("bind %s to %s: %v", pod.Name, node, err)
	}
}

func (k kubelet) status(pod *corev1.Pod, phase corev1.PodPhase, ready bool) {
	k.t.Helper()
	ctx := testCtx(k.t)
	if err := env.Client.Get(ctx, client.ObjectKeyFromObject(pod), pod); err != nil {
		k.t.Fatal(err)
	}
	cond := corev1.ConditionFalse
	if ready {
		cond = corev1.ConditionTrue
	}
	pod.Status.Phase = phase
	pod.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: cond, LastTransitionTime: metav1.NewTime(clk.Now())}}
	if phase == corev1.PodFailed {
		pod.Status.Message = "share-manager exited 1"
	}
	if err := env.Client.Status().Update(ctx, pod); err != nil {
		k.t.Fatalf("pod %s status %s: %v", pod.Name, phase, err)
	}
}

// renew writes the share's Lease as the share manager in pod does.
func renew(t *testing.T, volume string, pod *corev1.Pod) {
	t.Helper()
	ctx := testCtx(t)
	lease := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: volume, Namespace: namespace}}
	err := env.Client.Get(ctx, client.ObjectKeyFromObject(lease), lease)
	now := metav1.NewMicroTime(clk.Now())
	lease.Spec.HolderIdentity = ptr.To(pod.Name + "_" + string(pod.UID))
	lease.Spec.LeaseDurationSeconds = ptr.To[int32](3)
	lease.Spec.RenewTime = &now
	switch {
	case apierrors.IsNotFound(err):
		err = env.Client.Create(ctx, lease)
	case err == nil:
		err = env.Client.Update(ctx, lease)
	}
	if err != nil {
		t.Fatalf("renew lease: %v", err)
	}
}

func remountRequestedAt(t *testing.T, volume string) time.Time {
	t.Helper()
	vol := &v1.Volume{}
	if err := env.Client.Get(testCtx(t), client.ObjectKey{Name: volume}, vol); err != nil {
		t.Fatal(err)
	}
	if vol.Status.RemountRequestedAt == nil {
		return time.Time{}
	}
	return vol.Status.RemountRequestedAt.Time
}

// TestShareManagerStateMachine drives one share through every state with
// real pod status changes: stopped (no workload) → starting (pod pending,
// then running but not ready) → running → error (Lease lapsed) → starting
// (new pod) → running → error (pod failed) → starting → running →
// stopping (last workload gone, pod terminating) → stopped (pod gone).
func TestShareManagerStateMachine(t *testing.T) {
	suite.Require(t)
	const vname = "pvc-rwx-states"
	rec := recordStates(t, vname)
	// A grace below the NFS lease (a cluster made when the default was
	// 10 s): the pod gets the lease's (checkPod).
	vol := newVolume(t, vname, v1.VolumeModeFilesystem, "", v1.RWXSpec{LeaseDurationSeconds: ptr.To[int32](3), NFSGraceSeconds: ptr.To[int32](10)})
	k := kubelet{t}

	sm := waitShare(t, vname, v1.ShareStopped)
	if ref := metav1.GetControllerOf(sm); ref == nil || ref.Kind != "Volume" || ref.Name != vname || ref.UID != vol.UID {
		t.Errorf("ShareManager controller reference = %+v, want Volume %s", ref, vname)
	}
	if sm.Spec.Image != opts.Image || sm.Spec.Volume != vname {
		t.Errorf("ShareManager spec = %+v", sm.Spec)
	}
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "share-manager-" + vname, Namespace: namespace}}
	env.WaitGet(t, waitLimit, svc)
	if svc.Spec.Selector[sharemanager.LabelShare] != svc.Name || len(svc.Spec.Ports) != 1 || svc.Spec.Ports[0].Port != 2049 {
		t.Errorf("service = %+v", svc.Spec)
	}

	// A workload mounts: a pod starts, pending, then running but not ready.
	useVolume(t, vname, "web-0")
	waitShare(t, vname, v1.ShareStarting)
	pod := sharePod(t, vname, "")
	checkPod(t, pod, vname, "")
	if args := strings.Join(pod.Spec.Containers[0].Args, " "); strings.Contains(args, "--lease-seen") {
		t.Errorf("first pod, with no Lease yet, is told of one: %s", args)
	}
	if labels := pod.Labels; labels[sharemanager.LabelShare] != svc.Name {
		t.Errorf("pod labels %v do not match the service selector %v", labels, svc.Spec.Selector)
	}
	checkClaim(t, pod, vol)
	k.bind(pod, "node-a")
	k.status(pod, corev1.PodPending, false)
	k.status(pod, corev1.PodRunning, false)
	time.Sleep(300 * time.Millisecond) // room for a wrong transition to show
	waitShare(t, vname, v1.ShareStarting)

	// Ready: running, endpoint through the Service, on node-a.
	renew(t, vname, pod)
	k.status(pod, corev1.PodRunning, true)
	sm = waitShare(t, vname, v1.ShareRunning)
	if want := "nfs://share-manager-" + vname + "." + namespace + ".svc/" + vname; sm.Status.Endpoint != want || sm.Status.OwnerID != "node-a" {
		t.Errorf("running share: endpoint %q owner %q, want %q on node-a", sm.Status.Endpoint, sm.Status.OwnerID, want)
	}
	// Renewals keep it running while the clock moves past one lease duration.
	for i := 0; i < 4; i++ {
		clk.SetTime(clk.Now().Add(time.Second))
		renew(t, vname, pod)
		time.Sleep(200 * time.Millisecond)
	}
	waitShare(t, vname, v1.ShareRunning)

	// The Lease lapses (renewals stop; pod still "ready" as seen by a node
	// that is gone): the pod is force-deleted, a new one starts away from
	// node-a, and workloads are asked to remount.
	before := gathered(t)
	clk.SetTime(clk.Now().Add(4 * time.Second))
	pod2 := failedOver(t, vname, pod, "node-a", 1)
	// Two seconds (of the controllers' clock) to serve again.
	clk.SetTime(clk.Now().Add(2 * time.Second))
	serve(t, k, vname, pod2, "node-b")

	// The pod fails: error, then a new pod, avoiding node-b.
	clk.SetTime(clk.Now().Add(time.Second))
	k.status(pod2, corev1.PodFailed, false)
	pod3 := failedOver(t, vname, pod2, "node-b", 2)
	serve(t, k, vname, pod3, "node-a")

	// Each failover counted by its reason, and timed failure to running.
	testenv.Eventually(t, waitLimit, "both failovers timed", func(context.Context) (bool, error) {
		return gathered(t)["berth_share_failover_duration_seconds_count"]-before["berth_share_failover_duration_seconds_count"] == 2, nil
	})
	after := gathered(t)
	testenv.WantDelta(t, "lapsed Lease", before, after, testenv.Series("berth_share_failovers_total", "reason", "LeaseExpired"), 1)
	testenv.WantDelta(t, "failed pod", before, after, testenv.Series("berth_share_failovers_total", "reason", "PodFailed"), 1)
	testenv.WantDelta(t, "time to running", before, after, "berth_share_failover_duration_seconds_sum", 2)

	// The last workload goes: stopping while the pod terminates (no
	// kubelet here confirms it); its node is gone too, so once the Lease
	// it holds lapses the pod is force-deleted: stopped.
	useVolume(t, vname, "")
	waitShare(t, vname, v1.ShareStopping)
	testenv.Eventually(t, waitLimit, "share-manager pod terminating", func(ctx context.Context) (bool, error) {
		p := &corev1.Pod{}
		err := env.Client.Get(ctx, client.ObjectKeyFromObject(pod3), p)
		return err == nil && !p.DeletionTimestamp.IsZero(), err
	})
	time.Sleep(300 * time.Millisecond)
	waitShare(t, vname, v1.ShareStopping)
	clk.SetTime(clk.Now().Add(4 * time.Second))
	sm = waitShare(t, vname, v1.ShareStopped)
	if sm.Status.Endpoint != "" || sm.Status.OwnerID != "" {
		t.Errorf("stopped share keeps endpoint %q owner %q", sm.Status.Endpoint, sm.Status.OwnerID)
	}

	want := []v1.ShareState{
		v1.ShareStopped, v1.ShareStarting, v1.ShareRunning,
		v1.ShareError, v1.ShareStarting, v1.ShareRunning,
		v1.ShareError, v1.ShareStarting, v1.ShareRunning,
		v1.ShareStopping, v1.ShareStopped,
	}
	testenv.Eventually(t, waitLimit, "every transition seen", func(context.Context) (bool, error) { return len(rec.get()) >= len(want), nil })
	if got := rec.get(); !reflect.DeepEqual(got, want) {
		t.Errorf("transitions:\n got %v\nwant %v", got, want)
	}
}

// gathered is what the running controller's failover metrics hold.
func gathered(t *testing.T) testenv.Samples {
	t.Helper()
	s, err := testenv.Gathered(shareMetrics)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// failedOver waits for the pod that replaces old on node and checks what
// the failover left: the count, the failed node, remountRequestedAt (now).
func failedOver(t *testing.T, volume string, old *corev1.Pod, node string, count int32) *corev1.Pod {
	t.Helper()
	at := clk.Now()
	pod := sharePod(t, volume, old.UID)
	sm := waitShare(t, volume, v1.ShareStarting)
	if sm.Status.FailedNode != node || sm.Status.Failovers != count {
		t.Errorf("after failover: failedNode %q failovers %d, want %s, %d", sm.Status.FailedNode, sm.Status.Failovers, node, count)
	}
	if got := remountRequestedAt(t, volume); !got.Equal(at) {
		t.Errorf("remountRequestedAt = %v, want %v", got, at)
	}
	checkPod(t, pod, volume, node)
	checkSeen(t, pod, volume)
	return pod
}

// checkSeen checks what a replacement pod is told of the old holder's
// Lease: its current version, and a time seen unchanged no longer than the
// controller's clock moved since that renewal (more would let the new
// share manager take over before the old one lapsed).
func checkSeen(t *testing.T, pod *corev1.Pod, volume string) {
	t.Helper()
	lease := &coordinationv1.Lease{}
	if err := env.Client.Get(testCtx(t), client.ObjectKey{Namespace: namespace, Name: volume}, lease); err != nil {
		t.Fatal(err)
	}
	var version, seenFor string
	for _, a := range pod.Spec.Containers[0].Args {
		if v, ok := strings.CutPrefix(a, "--lease-seen-version="); ok {
			version = v
		}
		if v, ok := strings.CutPrefix(a, "--lease-seen-for="); ok {
			seenFor = v
		}
	}
	d, err := time.ParseDuration(seenFor)
	if version != lease.ResourceVersion || err != nil || d < 0 || d > clk.Since(lease.Spec.RenewTime.Time) {
		t.Errorf("new pod told the Lease was seen at version %q for %q (%v); want version %s, for at most %s since its renewal",
			version, seenFor, err, lease.ResourceVersion, clk.Since(lease.Spec.RenewTime.Time))
	}
}

// serve plays a share manager that comes up on node: bound, Lease taken,
// ready; the share runs there.
func serve(t *testing.T, k kubelet, volume string, pod *corev1.Pod, node string) {
	t.Helper()
	k.bind(pod, node)
	renew(t, volume, pod)
	k.status(pod, corev1.PodRunning, true)
	if sm := waitShare(t, volume, v1.ShareRunning); sm.Status.OwnerID != node {
		t.Errorf("share runs on %q, want %s", sm.Status.OwnerID, node)
	}
}

// checkClaim checks that the pod reaches the volume as a block device
// through a claim pre-bound to a static PersistentVolume of the same image,
// one that never deletes it.
func checkClaim(t *testing.T, pod *corev1.Pod, vol *v1.Volume) {
	t.Helper()
	name := sharemanager.Name(vol.Name)
	if len(pod.Spec.Volumes) != 1 || pod.Spec.Volumes[0].PersistentVolumeClaim == nil || pod.Spec.Volumes[0].PersistentVolumeClaim.ClaimName != name ||
		len(pod.Spec.Containers[0].VolumeDevices) != 1 {
		t.Errorf("pod volumes %+v devices %+v, want claim %s as a block device", pod.Spec.Volumes, pod.Spec.Containers[0].VolumeDevices, name)
	}
	pvc := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace}}
	pv := &corev1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: name}}
	env.WaitGet(t, waitLimit, pvc)
	env.WaitGet(t, waitLimit, pv)
	if pvc.Spec.VolumeName != name || pvc.Spec.VolumeMode == nil || *pvc.Spec.VolumeMode != corev1.PersistentVolumeBlock {
		t.Errorf("claim spec %+v", pvc.Spec)
	}
	c := pv.Spec.CSI
	if c == nil || c.Driver != v1.DriverName || c.VolumeHandle != volid.ShareDevice(vol.Name) || pv.Spec.PersistentVolumeReclaimPolicy != corev1.PersistentVolumeReclaimRetain ||
		pv.Spec.ClaimRef == nil || pv.Spec.ClaimRef.Name != name || pv.Spec.ClaimRef.Namespace != namespace {
		t.Errorf("persistent volume spec %+v", pv.Spec)
	}
	if ref := metav1.GetControllerOf(pv); ref == nil || ref.Kind != "Volume" || ref.UID != vol.UID {
		t.Errorf("persistent volume controller reference = %+v, want the Volume", ref)
	}
}

// kubeletVolumeName is the name kubelet keys a CSI PersistentVolume's state
// by on a node (its actual and desired state of the world, and whether the
// device is staged): driver^handle, as in k8s.io/kubernetes
// pkg/volume/csi/csi_plugin.go GetVolumeName.
func kubeletVolumeName(pv *corev1.PersistentVolume) string {
	return "kubernetes.io/csi/" + pv.Spec.CSI.Driver + "^" + pv.Spec.CSI.VolumeHandle
}

// TestSharePVIsAnotherVolumeToKubelet: the share manager's PV and the
// claim's PV of the same volume are two volumes to kubelet. With one
// handle they were one: a workload's filesystem stage of the claim on the
// share manager's node marked the device staged, so kubelet skipped the
// share manager's block NodeStageVolume and its NodePublishVolume failed
// "volume is not staged on this node" for good (issue #33); or kubelet
// tore the block stage down as the filesystem one, which left it staged.
func TestSharePVIsAnotherVolumeToKubelet(t *testing.T) {
	suite.Require(t)
	const name = "pvc-rwx-kubelet-name"
	newVolume(t, name, v1.VolumeModeFilesystem, "node-a", v1.RWXSpec{})
	useVolume(t, name, "web-0")
	sharePod(t, name, "")
	share := &corev1.PersistentVolume{}
	if err := env.Client.Get(testCtx(t), client.ObjectKey{Name: sharemanager.Name(name)}, share); err != nil {
		t.Fatalf("share PV: %v", err)
	}
	// The claim's PV as the CSI provisioner makes it: the handle is the
	// volume ID CreateVolume returned, the Volume's name.
	claim := &corev1.PersistentVolume{Spec: corev1.PersistentVolumeSpec{PersistentVolumeSource: corev1.PersistentVolumeSource{
		CSI: &corev1.CSIPersistentVolumeSource{Driver: v1.DriverName, VolumeHandle: name}}}}
	if kubeletVolumeName(share) == kubeletVolumeName(claim) {
		t.Fatalf("kubelet names both the share PV and the claim's PV %s: one volume to it on the share manager's node", kubeletVolumeName(share))
	}
	if v, viaShare := volid.ParseHandle(share.Spec.CSI.VolumeHandle); v != name || !viaShare {
		t.Errorf("share PV handle %q names volume %q (share device %v), want %s", share.Spec.CSI.VolumeHandle, v, viaShare, name)
	}
}

// TestOldSharePVReplaced: a share PersistentVolume made before the share
// device handle (the volume ID as its handle: one volume with the claim's
// to kubelet) is deleted with its claim when the share starts, and made
// anew with the share device handle before the pod is.
func TestOldSharePVReplaced(t *testing.T) {
	suite.Require(t)
	const vname = "pvc-rwx-old-handle"
	vol := newVolume(t, vname, v1.VolumeModeFilesystem, "node-o", v1.RWXSpec{})
	ctx := testCtx(t)
	name := sharemanager.Name(vname)
	old := &corev1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: corev1.PersistentVolumeSpec{
		AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce}, VolumeMode: ptr.To(corev1.PersistentVolumeBlock),
		Capacity:                      corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")},
		PersistentVolumeReclaimPolicy: corev1.PersistentVolumeReclaimRetain,
		ClaimRef:                      &corev1.ObjectReference{Kind: "PersistentVolumeClaim", APIVersion: "v1", Namespace: namespace, Name: name},
		PersistentVolumeSource:        corev1.PersistentVolumeSource{CSI: &corev1.CSIPersistentVolumeSource{Driver: v1.DriverName, VolumeHandle: vname}},
	}}
	oldClaim := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace}, Spec: corev1.PersistentVolumeClaimSpec{
		AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce}, VolumeMode: ptr.To(corev1.PersistentVolumeBlock),
		StorageClassName: ptr.To(""), VolumeName: name,
		Resources: corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}},
	}}
	for _, o := range []client.Object{old, oldClaim} {
		if err := env.Client.Create(ctx, o); err != nil {
			t.Fatalf("create the old %T: %v", o, err)
		}
	}
	useVolume(t, vname, "web-0")
	// No storage-protection controllers run here: what is deleted goes.
	release := func(ctx context.Context, o client.Object) error {
		if err := env.Client.Get(ctx, client.ObjectKeyFromObject(o), o); err != nil || o.GetDeletionTimestamp().IsZero() {
			return client.IgnoreNotFound(err)
		}
		return client.IgnoreNotFound(env.Client.Patch(ctx, o, client.RawPatch(types.MergePatchType, []byte(`{"metadata":{"finalizers":null}}`))))
	}
	testenv.Eventually(t, waitLimit, "share PV made anew", func(ctx context.Context) (bool, error) {
		for _, o := range []client.Object{&corev1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: name}},
			&corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace}}} {
			if err := release(ctx, o); err != nil {
				return false, err
			}
		}
		pv := &corev1.PersistentVolume{}
		err := env.Client.Get(ctx, client.ObjectKey{Name: name}, pv)
		return err == nil && pv.UID != old.UID && pv.Spec.CSI.VolumeHandle == volid.ShareDevice(vname), client.IgnoreNotFound(err)
	})
	pod := sharePod(t, vname, "")
	checkClaim(t, pod, vol)
}

// TestShareWithoutFastFailover: with spec.rwx.fastFailover off, a lapsed
// Lease changes nothing; a failed pod still gives error, then a new pod.
func TestShareWithoutFastFailover(t *testing.T) {
	suite.Require(t)
	const vname = "pvc-rwx-slow"
	newVolume(t, vname, v1.VolumeModeFilesystem, "", v1.RWXSpec{FastFailover: ptr.To(false), LeaseDurationSeconds: ptr.To[int32](3)})
	k := kubelet{t}
	useVolume(t, vname, "web-1")
	pod := sharePod(t, vname, "")
	serve(t, k, vname, pod, "node-a")

	// A lapsed Lease, and a Lease event to make the controller look.
	clk.SetTime(clk.Now().Add(time.Minute))
	lease := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: vname, Namespace: namespace}}
	env.WaitGet(t, waitLimit, lease)
	lease.Annotations = map[string]string{"touched": "yes"}
	if err := env.Client.Update(testCtx(t), lease); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second)
	if sm := waitShare(t, vname, v1.ShareRunning); sm.Status.Failovers != 0 {
		t.Errorf("failovers %d after a lapsed lease without fast failover", sm.Status.Failovers)
	}
	k.status(pod, corev1.PodFailed, false)
	failedOver(t, vname, pod, "node-a", 1)
}

// TestLapsedLeaseOfUnreadyPod: a lost node's pods turn unready (the node
// controller marks them) long before they go; the share fails over when
// the Lease the pod took lapses, ready or not.
func TestLapsedLeaseOfUnreadyPod(t *testing.T) {
	suite.Require(t)
	const vname = "pvc-rwx-lost"
	newVolume(t, vname, v1.VolumeModeFilesystem, "", v1.RWXSpec{LeaseDurationSeconds: ptr.To[int32](3)})
	k := kubelet{t}
	useVolume(t, vname, "web-2")
	pod := sharePod(t, vname, "")
	serve(t, k, vname, pod, "node-a")

	k.status(pod, corev1.PodRunning, false)
	waitShare(t, vname, v1.ShareStarting)
	clk.SetTime(clk.Now().Add(4 * time.Second))
	serve(t, k, vname, failedOver(t, vname, pod, "node-a", 1), "node-b")
}

// checkPod checks the share-manager pod's command and placement.
func checkPod(t *testing.T, pod *corev1.Pod, volume, avoid string) {
	t.Helper()
	if len(pod.Spec.Containers) != 1 {
		t.Fatalf("pod containers: %d", len(pod.Spec.Containers))
	}
	if !slices.Equal(pod.Spec.ImagePullSecrets, opts.ImagePullSecrets) || pod.Spec.PriorityClassName != "system-cluster-critical" {
		t.Errorf("pod image pull secrets %v priority class %q", pod.Spec.ImagePullSecrets, pod.Spec.PriorityClassName)
	}
	c := pod.Spec.Containers[0]
	args := strings.Join(c.Args, " ")
	for _, want := range []string{"share-manager ", "--volume=" + volume, "--lease-name=" + volume, "--lease-namespace=" + namespace, "--lease-duration=3s",
		"--nfs-lease=15s", "--nfs-grace=15s"} {
		if !strings.Contains(args, want) {
			t.Errorf("pod args %q lack %q", args, want)
		}
	}
	// Not privileged (F9): the capabilities a mount, fsck and ganesha
	// need, and the device kubelet adds for the claim.
	if sc := c.SecurityContext; c.Image != opts.Image || sc == nil || sc.Privileged == nil || *sc.Privileged ||
		sc.Capabilities == nil || !slices.Contains(sc.Capabilities.Add, "SYS_ADMIN") || len(c.VolumeDevices) != 1 {
		t.Errorf("container image %q security %+v devices %+v", c.Image, c.SecurityContext, c.VolumeDevices)
	}
	// The probes are kubelet's HTTP GETs of the share manager's
	// --health-addr: an exec of berth in the pod was too slow on a slow node.
	if !strings.Contains(args, "--health-addr=:"+strconv.Itoa(sharemanager.HealthPort)) ||
		!slices.ContainsFunc(c.Ports, func(p corev1.ContainerPort) bool {
			return p.Name == "health" && p.ContainerPort == sharemanager.HealthPort
		}) {
		t.Errorf("pod args %q, ports %+v: no health endpoint on %d", args, c.Ports, sharemanager.HealthPort)
	}
	for _, p := range []struct {
		probe *corev1.Probe
		path  string
	}{{c.ReadinessProbe, "/readyz"}, {c.LivenessProbe, "/healthz"}} {
		if p.probe == nil || p.probe.HTTPGet == nil || p.probe.HTTPGet.Path != p.path || p.probe.HTTPGet.Port.String() != "health" {
			t.Errorf("probe %s = %+v, want an HTTP GET of port health", p.path, p.probe)
		}
	}
	// Liveness is slow to kill: a share manager waiting for its device or
	// in NFS grace is alive; the heartbeat it reads is a minute's.
	if lp := c.LivenessProbe; lp != nil && (lp.PeriodSeconds*lp.FailureThreshold < 120 || lp.TimeoutSeconds < 5) {
		t.Errorf("liveness period %ds x %d failures, timeout %ds: kills too soon", lp.PeriodSeconds, lp.FailureThreshold, lp.TimeoutSeconds)
	}
	if ref := metav1.GetControllerOf(pod); ref == nil || ref.Kind != "ShareManager" || ref.Name != volume {
		t.Errorf("pod controller reference = %+v", ref)
	}
	a := pod.Spec.Affinity
	if avoid == "" {
		if a != nil {
			t.Errorf("first pod has affinity %+v", a)
		}
		return
	}
	if a == nil || a.NodeAffinity == nil || len(a.NodeAffinity.PreferredDuringSchedulingIgnoredDuringExecution) != 1 {
		t.Fatalf("replacement pod affinity = %+v, want to avoid %s", a, avoid)
	}
	f := a.NodeAffinity.PreferredDuringSchedulingIgnoredDuringExecution[0].Preference.MatchFields
	if len(f) != 1 || f[0].Operator != corev1.NodeSelectorOpNotIn || !reflect.DeepEqual(f[0].Values, []string{avoid}) {
		t.Errorf("replacement pod avoids %+v, want %s", f, avoid)
	}
}

// TestLocalVolumeShareStaysOnItsNode: only the node that holds a local
// volume's image can serve it, failed or not.
func TestLocalVolumeShareStaysOnItsNode(t *testing.T) {
	suite.Require(t)
	const vname = "pvc-rwx-local"
	newVolume(t, vname, v1.VolumeModeFilesystem, "node-l", v1.RWXSpec{})
	useVolume(t, vname, "web-l")
	for i, pod := 0, sharePod(t, vname, ""); i < 2; i++ {
		a := pod.Spec.Affinity
		if a == nil || a.NodeAffinity == nil || a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution == nil ||
			a.NodeAffinity.PreferredDuringSchedulingIgnoredDuringExecution != nil {
			t.Fatalf("pod %d affinity = %+v, want node-l required, nothing preferred", i, a)
		}
		f := a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms[0].MatchFields
		if len(f) != 1 || f[0].Key != "metadata.name" || f[0].Operator != corev1.NodeSelectorOpIn || !reflect.DeepEqual(f[0].Values, []string{"node-l"}) {
			t.Errorf("pod %d placement %+v, want node-l", i, f)
		}
		kubelet{t}.bind(pod, "node-l")
		kubelet{t}.status(pod, corev1.PodFailed, false)
		pod = sharePod(t, vname, pod.UID)
	}
}

// TestCephShareVolumeCarriesStageSecret: the share-manager pod's PV of a
// ceph volume names the cluster's cephx Secret for NodeStageVolume, as the
// ceph classes do; without it no node could stage the share (seen in e2e:
// the pod stuck in ContainerCreating, "the stage request carries no cephx
// client"). A local volume's names none.
func TestCephShareVolumeCarriesStageSecret(t *testing.T) {
	suite.Require(t)
	for _, c := range []struct {
		name string
		spec v1.StorageClusterSpec
		want *corev1.SecretReference
	}{
		{"pvc-rwx-ceph", v1.StorageClusterSpec{Backend: v1.BackendCeph, Ceph: &v1.CephSpec{
			Monitors: []v1.CephMonitor{"10.0.0.1:3300"}, Pool: "rbd",
			SecretRef: v1.CephSecretReference{Name: "berth-ceph", Namespace: "berth-system"},
		}}, &corev1.SecretReference{Name: "berth-ceph", Namespace: "berth-system"}},
		{"pvc-rwx-nosecret", v1.StorageClusterSpec{}, nil},
	} {
		newVolumeIn(t, c.name, v1.VolumeModeFilesystem, "", c.spec)
		useVolume(t, c.name, "web-"+c.name)
		sharePod(t, c.name, "")
		pv := &corev1.PersistentVolume{}
		if err := env.Client.Get(testCtx(t), client.ObjectKey{Name: sharemanager.Name(c.name)}, pv); err != nil {
			t.Fatalf("%s: share PV: %v", c.name, err)
		}
		if got := pv.Spec.CSI.NodeStageSecretRef; !reflect.DeepEqual(got, c.want) {
			t.Errorf("%s: share PV's nodeStageSecretRef = %+v, want %+v", c.name, got, c.want)
		}
	}
}

// TestSharedVolumeLabeled: every shared Volume carries the shared label,
// local or ceph, by which the agents of the nodes that mount it watch it
// (their checks after a failover); a block volume gets none.
func TestSharedVolumeLabeled(t *testing.T) {
	suite.Require(t)
	newVolume(t, "pvc-label-local", v1.VolumeModeFilesystem, "node-a", v1.RWXSpec{})
	newVolume(t, "pvc-label-ceph", v1.VolumeModeFilesystem, "", v1.RWXSpec{})
	newVolume(t, "pvc-label-block", v1.VolumeModeBlock, "node-a", v1.RWXSpec{})
	for _, name := range []string{"pvc-label-local", "pvc-label-ceph"} {
		testenv.Eventually(t, waitLimit, name+" labeled shared", func(ctx context.Context) (bool, error) {
			vol := &v1.Volume{}
			err := env.Client.Get(ctx, client.ObjectKey{Name: name}, vol)
			return err == nil && vol.Labels[v1.SharedLabel] == "true", err
		})
	}
	time.Sleep(time.Second)
	vol := &v1.Volume{}
	if err := env.Client.Get(testCtx(t), client.ObjectKey{Name: "pvc-label-block"}, vol); err != nil {
		t.Fatal(err)
	}
	if _, ok := vol.Labels[v1.SharedLabel]; ok {
		t.Errorf("block volume labels %v, want no %s", vol.Labels, v1.SharedLabel)
	}
}

// TestBlockVolumeGetsNoShare: an RWX block volume is no share (CSI refuses
// to make one; one made by hand gets no ShareManager).
func TestBlockVolumeGetsNoShare(t *testing.T) {
	suite.Require(t)
	const vname = "pvc-rwx-block"
	newVolume(t, vname, v1.VolumeModeBlock, "", v1.RWXSpec{})
	useVolume(t, vname, "vm-0")
	time.Sleep(time.Second)
	err := env.Client.Get(testCtx(t), client.ObjectKey{Namespace: namespace, Name: vname}, &v1.ShareManager{})
	if !apierrors.IsNotFound(err) {
		t.Errorf("ShareManager of a block volume: err = %v, want NotFound", err)
	}
}

// TestKeepRunningAnnotationHoldsTheShare: with no workload, the annotation
// alone starts the share and keeps it running; without it the share stops.
func TestKeepRunningAnnotationHoldsTheShare(t *testing.T) {
	suite.Require(t)
	const vname = "pvc-rwx-keep"
	newVolume(t, vname, v1.VolumeModeFilesystem, "", v1.RWXSpec{})
	sm := waitShare(t, vname, v1.ShareStopped)
	annotate := func(value *string) {
		t.Helper()
		patch := `{"metadata":{"annotations":{"` + v1.KeepRunningAnnotation + `":null}}}`
		if value != nil {
			patch = `{"metadata":{"annotations":{"` + v1.KeepRunningAnnotation + `":"` + *value + `"}}}`
		}
		if err := env.Client.Patch(testCtx(t), sm, client.RawPatch(types.MergePatchType, []byte(patch))); err != nil {
			t.Fatal(err)
		}
	}
	annotate(ptr.To("true"))
	waitShare(t, vname, v1.ShareStarting)
	pod := sharePod(t, vname, "")
	serve(t, kubelet{t}, vname, pod, "node-k")
	annotate(nil)
	waitShare(t, vname, v1.ShareStopping)
}

// TestDeletedVolumeStopsItsStartingShare: a Volume deleted while its share
// starts (the pod bound, not ready, no Lease taken: nothing else changes)
// stops the share at once: the image's deletion waits for the share
// manager's stage, so a share left starting would hold the Volume for good.
func TestDeletedVolumeStopsItsStartingShare(t *testing.T) {
	suite.Require(t)
	const vname = "pvc-rwx-deleted-starting"
	vol := newVolume(t, vname, v1.VolumeModeFilesystem, "node-d", v1.RWXSpec{})
	useVolume(t, vname, "web-0")
	pod := sharePod(t, vname, "")
	kubelet{t}.bind(pod, "node-d")
	waitShare(t, vname, v1.ShareStarting)
	useVolume(t, vname, "web-0") // still used: only the deletion stops it

	// The agent's image finalizer keeps the Volume while its image stays.
	ctx := testCtx(t)
	patch := client.RawPatch(types.MergePatchType, []byte(`{"metadata":{"finalizers":["`+v1.ImageFinalizer+`"]}}`))
	if err := env.Client.Patch(ctx, vol, patch); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = env.Client.Patch(context.Background(), vol, client.RawPatch(types.MergePatchType, []byte(`{"metadata":{"finalizers":null}}`)))
	})
	if err := env.Client.Delete(ctx, vol); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, waitLimit, "share of the deleted volume stopping", func(ctx context.Context) (bool, error) {
		sm := &v1.ShareManager{}
		if err := env.Client.Get(ctx, client.ObjectKey{Namespace: namespace, Name: vname}, sm); err != nil {
			return false, err
		}
		p := &corev1.Pod{}
		err := env.Client.Get(ctx, client.ObjectKeyFromObject(pod), p)
		gone := apierrors.IsNotFound(err) || err == nil && !p.DeletionTimestamp.IsZero()
		return sm.Status.State == v1.ShareStopping && gone, client.IgnoreNotFound(err)
	})
}

// TestShareSizeFromLease: the size the running share manager reports on
// its Lease (after an expansion, once the served filesystem grew) is the
// ShareManager's status.size, the Size column of `kubectl get bsm`; a
// report by a holder that is not the pod counts for nothing.
func TestShareSizeFromLease(t *testing.T) {
	suite.Require(t)
	const vname = "pvc-rwx-size"
	newVolume(t, vname, v1.VolumeModeFilesystem, "", v1.RWXSpec{})
	useVolume(t, vname, "web-s")
	pod := sharePod(t, vname, "")
	serve(t, kubelet{t}, vname, pod, "node-s")
	report := func(holder, size string) {
		t.Helper()
		lease := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: vname, Namespace: namespace}}
		if err := env.Client.Get(testCtx(t), client.ObjectKeyFromObject(lease), lease); err != nil {
			t.Fatal(err)
		}
		lease.Spec.HolderIdentity = ptr.To(holder)
		lease.Annotations = map[string]string{v1.ShareSizeAnnotation: size}
		if err := env.Client.Update(testCtx(t), lease); err != nil {
			t.Fatal(err)
		}
	}
	waitSize := func(want string) {
		t.Helper()
		deadline := time.Now().Add(waitLimit)
		for {
			sm := &v1.ShareManager{}
			if err := env.Client.Get(testCtx(t), client.ObjectKey{Namespace: namespace, Name: vname}, sm); err != nil {
				t.Fatal(err)
			}
			if sm.Status.Size != nil && sm.Status.Size.String() == want {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("share size %v, want %s", sm.Status.Size, want)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	holder := pod.Name + "_" + string(pod.UID)
	report(holder, "536870912")
	waitSize("512Mi")
	report("someone-else", "2147483648")
	time.Sleep(time.Second)
	if sm := waitShare(t, vname, v1.ShareRunning); sm.Status.Size == nil || sm.Status.Size.String() != "512Mi" {
		t.Errorf("size %v after another holder's report, want 512Mi", sm.Status.Size)
	}
	report(holder, "1073741824")
	waitSize("1Gi")
}

// TestStoppedShareNeededAgainIsNoFailover: the last workload goes, the
// share stops (its pod told to terminate exits 0 and releases its Lease),
// and a new workload comes before the pod object is gone. The share starts
// again once the pod is gone: no failover counted, no remount asked. Before,
// the exited pod read as failed: state error, a failover, a remount request
// (seen on the VM e2e node, where a reader started as the writer left).
func TestStoppedShareNeededAgainIsNoFailover(t *testing.T) {
	suite.Require(t)
	const vname = "pvc-rwx-stop-start"
	rec := recordStates(t, vname)
	newVolume(t, vname, v1.VolumeModeFilesystem, "", v1.RWXSpec{LeaseDurationSeconds: ptr.To[int32](3)})
	waitShare(t, vname, v1.ShareStopped)
	k := kubelet{t}
	useVolume(t, vname, "writer")
	pod := sharePod(t, vname, "")
	serve(t, k, vname, pod, "node-a")
	remountBefore := remountRequestedAt(t, vname)

	useVolume(t, vname, "")
	waitShare(t, vname, v1.ShareStopping)
	testenv.Eventually(t, waitLimit, "share-manager pod terminating", func(ctx context.Context) (bool, error) {
		p := &corev1.Pod{}
		err := env.Client.Get(ctx, client.ObjectKeyFromObject(pod), p)
		return err == nil && !p.DeletionTimestamp.IsZero(), err
	})
	// It stops cleanly: Lease released, exit 0; the pod object stays
	// until kubelet confirms, and a reader comes meanwhile.
	release := &coordinationv1.Lease{}
	if err := env.Client.Get(testCtx(t), client.ObjectKey{Namespace: namespace, Name: vname}, release); err != nil {
		t.Fatal(err)
	}
	release.Spec.HolderIdentity = nil
	if err := env.Client.Update(testCtx(t), release); err != nil {
		t.Fatal(err)
	}
	k.status(pod, corev1.PodSucceeded, false)
	useVolume(t, vname, "reader")
	waitShare(t, vname, v1.ShareStarting)
	time.Sleep(500 * time.Millisecond) // room for a wrong failover to show
	if sm := waitShare(t, vname, v1.ShareStarting); sm.Status.Failovers != 0 || sm.Status.FailedNode != "" {
		t.Errorf("a share stopped on purpose counted a failover: failovers %d, failed node %q", sm.Status.Failovers, sm.Status.FailedNode)
	}
	if got := remountRequestedAt(t, vname); !got.Equal(remountBefore) {
		t.Errorf("remountRequestedAt = %v, want %v: nothing failed over", got, remountBefore)
	}

	// kubelet confirms the deletion: the next pod starts and serves.
	if err := env.Client.Delete(testCtx(t), pod, client.GracePeriodSeconds(0)); client.IgnoreNotFound(err) != nil {
		t.Fatal(err)
	}
	next := sharePod(t, vname, pod.UID)
	serve(t, k, vname, next, "node-a")
	want := []v1.ShareState{v1.ShareStopped, v1.ShareStarting, v1.ShareRunning, v1.ShareStopping, v1.ShareStarting, v1.ShareRunning}
	testenv.Eventually(t, waitLimit, "every transition seen", func(context.Context) (bool, error) { return len(rec.get()) >= len(want), nil })
	if got := rec.get(); !reflect.DeepEqual(got, want) {
		t.Errorf("transitions:\n got %v\nwant %v", got, want)
	}
}
