// Package sharemanager holds the operator's controllers of read-write-many
// volumes: VolumeReconciler gives every RWX filesystem Volume a ShareManager
// and mirrors its state, and Reconciler runs each ShareManager's pod and
// Service and fails a share over when its pod fails or its Lease lapses.
//
// A share is needed while the Volume's Attachment lists a workload pod (an
// entry with a pod other than the share manager's own), or while its
// ShareManager carries v1.KeepRunningAnnotation. The first is the contract
// with the CSI node service: it records a workload's entry before it waits
// for the share, so a pod about to mount the volume starts the share, and
// the last workload's unpublish stops it.
//
// States: stopped (not needed, no pod) → starting (pod pending or not
// ready) → running (ready; endpoint set) → error (the pod failed, or the
// Lease it took lapsed: the pod is removed, forcibly with fast failover,
// and the Volume's remountRequestedAt set) → starting (a new pod, steered
// away from the failed node) … → stopping (not needed; the pod terminates)
// → stopped. unknown: the Volume is gone.
package sharemanager

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/record"
	"k8s.io/utils/clock"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	v1 "github.com/berth-io/berth/api/v1alpha1"
	"github.com/berth-io/berth/internal/metrics"
	"github.com/berth-io/berth/internal/share"
	"github.com/berth-io/berth/internal/volmap"
)

// Options of both controllers.
type Options struct {
	// Namespace holds the ShareManagers, their pods, Services and Leases.
	Namespace string
	// Image is the berth image (with nfs-ganesha) share managers run.
	Image           string
	ImagePullPolicy corev1.PullPolicy
	// ImagePullSecrets go on every share-manager pod (a private registry).
	ImagePullSecrets []corev1.LocalObjectReference
	// ServiceAccount of share-manager pods (it renews its Lease).
	ServiceAccount string
	// APIServerHost/Port, when set, point the pods at the API server
	// directly (clusters without kube-proxy).
	APIServerHost, APIServerPort string
}

// Ready condition reasons.
const (
	reasonStarting     = "PodStarting"
	reasonRunning      = "Serving"
	reasonPodFailed    = "PodFailed"
	reasonLeaseExpired = "LeaseExpired"
	reasonNotNeeded    = "NoWorkloads"
	reasonVolumeGone   = "VolumeNotFound"
)

// FailoverReasons are the reasons a share fails over for: the values of
// the failovers metric's reason label.
var FailoverReasons = []string{reasonPodFailed, reasonLeaseExpired}

// Reconciler runs ShareManagers.
type Reconciler struct {
	Client client.Client
	// Reader reads a share's PersistentVolume uncached (the operator
	// caches no PersistentVolumes); nil: Client.
	Reader  client.Reader
	Options Options
	// Clock decides when a Lease has lapsed.
	Clock    clock.PassiveClock
	Recorder record.EventRecorder
	// Metrics counts failovers and times them (nil: none).
	Metrics *metrics.Share
	Log     logr.Logger

	// failedAt is, per volume, when this controller failed its share over:
	// where the failover Metrics times begins.
	failedAt volmap.Map[time.Time]
	// seen is, per volume, the version of its Lease this controller saw
	// and since when (sighting): what a replacement share manager may
	// count toward the old holder's lapse.
	seen volmap.Map[sighting]
	// rolling holds shares moving to a new image to one at a time (roll).
	rolling sync.Mutex
}

// sighting is a Lease's resourceVersion and when this controller first
// saw it, by its own clock.
type sighting struct {
	version string
	at      time.Time
}

// observe records lease's version, keeping the time of the first sighting
// while the version stays the same.
func (r *Reconciler) observe(volume string, lease *coordinationv1.Lease) sighting {
	s := r.seen.Get(volume)
	if s.version != lease.ResourceVersion {
		s = sighting{version: lease.ResourceVersion, at: r.Clock.Now()}
		r.seen.Put(volume, s)
	}
	return s
}

// leaseSeen is what a new share-manager pod is told of the volume's Lease
// (zero: nothing, or nothing to wait for): the version held by another
// holder and how long this controller has seen it unchanged. The pod
// counts that toward the lapse it must see before it takes the Lease over
// (share.Lease.Acquire), so after a failover on a lapsed Lease it takes
// over at once instead of watching the old holder for a whole Lease
// duration more. Safe: the sighting was made before the pod existed, it
// measures only this controller's clock's rate, and it counts only while
// the Lease is still at that version when the pod takes it (a renewal by
// the old holder changes the version and the pod waits in full).
func (r *Reconciler) leaseSeen(ctx context.Context, volume, namespace string) (version string, unchangedFor time.Duration, err error) {
	lease := &coordinationv1.Lease{}
	switch err := r.Client.Get(ctx, client.ObjectKey{Namespace: namespace, Name: volume}, lease); {
	case apierrors.IsNotFound(err):
		r.seen.Take(volume)
		return "", 0, nil
	case err != nil:
		return "", 0, fmt.Errorf("read Lease %s: %w", volume, err)
	}
	s := r.observe(volume, lease)
	if ptr.Deref(lease.Spec.HolderIdentity, "") == "" {
		return "", 0, nil // released: taken at once anyway
	}
	return s.version, r.Clock.Since(s.at), nil
}

// Reconcile implements reconcile.Reconciler.
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	if req.Namespace != r.Options.Namespace {
		// Shares run in the operator's namespace only: its roles cover
		// nothing elsewhere, and the Volume's ShareManager is made there.
		return ctrl.Result{}, nil
	}
	sm := &v1.ShareManager{}
	if err := r.Client.Get(ctx, req.NamespacedName, sm); err != nil {
		if apierrors.IsNotFound(err) {
			r.seen.Take(req.Name) // named after its volume, as its Lease
			r.failedAt.Take(req.Name)
		}
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if !sm.DeletionTimestamp.IsZero() {
		return ctrl.Result{}, nil // the pod and Service go with it (owner references)
	}
	log := r.Log.WithValues("sharemanager", req.NamespacedName.String(), "volume", sm.Spec.Volume)
	vol := &v1.Volume{}
	if err := r.Client.Get(ctx, client.ObjectKey{Name: sm.Spec.Volume}, vol); err != nil {
		if apierrors.IsNotFound(err) {
			return ctrl.Result{}, r.setStatus(ctx, sm, v1.ShareUnknown, "", reasonVolumeGone, "volume "+sm.Spec.Volume+" not found")
		}
		return ctrl.Result{}, err
	}
	rwx, err := r.settings(ctx, vol)
	if err != nil {
		return ctrl.Result{}, err
	}
	if err := r.ensureService(ctx, sm); err != nil {
		return ctrl.Result{}, err
	}
	nodes, err := r.workloads(ctx, vol.Name, sm.Namespace)
	if err != nil {
		return ctrl.Result{}, err
	}
	// Before any pod starts: a share manager serves only these (F1).
	clients, err := r.clientsFor(ctx, nodes, rwx.cluster)
	if err != nil {
		return ctrl.Result{}, err
	}
	if err := r.setClients(ctx, sm, clients); err != nil {
		return ctrl.Result{}, err
	}
	needed := len(nodes) > 0 || sm.Annotations[v1.KeepRunningAnnotation] == "true"
	// A Volume on its way out needs no share: its image goes only once the
	// share manager's attachment is released.
	needed = needed && vol.DeletionTimestamp.IsZero()
	pod := &corev1.Pod{}
	switch err := r.Client.Get(ctx, client.ObjectKey{Namespace: sm.Namespace, Name: Name(vol.Name)}, pod); {
	case apierrors.IsNotFound(err):
		pod = nil
	case err != nil:
		return ctrl.Result{}, err
	}

	if !needed {
		r.failedAt.Take(vol.Name) // no share wanted: no failover to time
		if pod == nil {
			return ctrl.Result{}, r.setStatus(ctx, sm, v1.ShareStopped, "", reasonNotNeeded, "no workload uses the volume")
		}
		if err := r.setStatus(ctx, sm, v1.ShareStopping, pod.Spec.NodeName, reasonNotNeeded, "no workload uses the volume: stopping "+pod.Name); err != nil {
			return ctrl.Result{}, err
		}
		return r.stop(ctx, log, vol.Name, pod, rwx)
	}

	if pod == nil {
		if ready, err := r.ensureClaim(ctx, log, sm, vol, rwx); err != nil || !ready {
			return ctrl.Result{RequeueAfter: claimRetry}, err
		}
		seenVersion, seenFor, err := r.leaseSeen(ctx, vol.Name, sm.Namespace)
		if err != nil {
			return ctrl.Result{}, err
		}
		pod = r.podFor(sm, vol, rwx, seenVersion, seenFor)
		if err := controllerutil.SetControllerReference(sm, pod, r.Client.Scheme()); err != nil {
			return ctrl.Result{}, err
		}
		if err := r.Client.Create(ctx, pod); err != nil && !apierrors.IsAlreadyExists(err) {
			return ctrl.Result{}, fmt.Errorf("create pod %s: %w", pod.Name, err)
		}
		log.Info("share manager pod created", "pod", pod.Name, "avoid", sm.Status.FailedNode)
		return ctrl.Result{}, r.setStatus(ctx, sm, v1.ShareStarting, "", reasonStarting, "pod "+pod.Name+" created")
	}

	left, held, rep, err := r.leaseLeft(ctx, vol.Name, pod, rwx)
	if err != nil {
		return ctrl.Result{}, err
	}
	lapsed := rwx.fastFailover && held && left <= 0
	if reason, why := failure(pod, lapsed, rwx); reason != "" {
		return r.failover(ctx, log, sm, vol, pod, rwx, reason, why)
	}
	if err := r.setSize(ctx, sm, rep.size); err != nil {
		return ctrl.Result{}, err
	}
	// Look again when the Lease would lapse without another renewal (each
	// renewal wakes this up earlier through the Lease watch).
	var res ctrl.Result
	if held && rwx.fastFailover {
		res.RequeueAfter = left + 100*time.Millisecond
	}
	switch {
	case !pod.DeletionTimestamp.IsZero():
		// Going away on its own (deleted by someone, or a graceful
		// replacement): a new one starts once it is gone.
		reason, msg := reasonStarting, "waiting for "+pod.Name+" to terminate"
		if outdated(sm, pod) {
			reason, msg = reasonUpgrading, "moving to "+sm.Spec.Image+": waiting for "+pod.Name+" to stop"
		}
		return ctrl.Result{RequeueAfter: rwx.leaseDuration}, r.setStatus(ctx, sm, v1.ShareStarting, pod.Spec.NodeName, reason, msg)
	case !podReady(pod):
		return res, r.setStatus(ctx, sm, v1.ShareStarting, pod.Spec.NodeName, reasonStarting, "pod "+pod.Name+" is "+string(pod.Status.Phase)+", not ready")
	}
	if err := r.recordFormat(ctx, vol); err != nil {
		return ctrl.Result{}, err
	}
	if err := r.setAdmitted(ctx, sm, admittedNodes(sm, pod, rep)); err != nil {
		return ctrl.Result{}, err
	}
	if err := r.setStatus(ctx, sm, v1.ShareRunning, pod.Spec.NodeName, reasonRunning, "serving from "+pod.Spec.NodeName); err != nil {
		return res, err
	}
	if at := r.failedAt.Take(vol.Name); !at.IsZero() {
		r.Metrics.Recovered(r.Clock.Since(at))
	}
	if outdated(sm, pod) {
		return r.roll(ctx, log, sm, pod)
	}
	return res, nil
}

// recordFormat records in the Volume's status that it holds a filesystem,
// once a share manager serves it (it mounted one, made or found): the
// next share manager is told never to format it
// (Volume.NeverFormatReason). The share manager itself may write no Volume.
func (r *Reconciler) recordFormat(ctx context.Context, vol *v1.Volume) error {
	if vol.Status.Formatted != nil {
		return nil
	}
	fsType := vol.Spec.FSType
	if fsType == "" {
		fsType = "ext4" // the share manager's default
	}
	orig := vol.DeepCopy()
	vol.Status.Formatted = &v1.VolumeFormat{FSType: fsType, Time: metav1.NewTime(r.Clock.Now())}
	if err := r.Client.Status().Patch(ctx, vol, client.MergeFrom(orig)); client.IgnoreNotFound(err) != nil {
		return fmt.Errorf("record the filesystem of volume %s: %w", vol.Name, err)
	}
	return nil
}

// stop deletes the pod of a share no workload needs: gracefully, so that
// the share manager stops ganesha, unmounts and releases its Lease; with
// fast failover forcibly once the Lease it still holds lapsed (its node is
// gone and would never confirm the deletion).
func (r *Reconciler) stop(ctx context.Context, log logr.Logger, volume string, pod *corev1.Pod, rwx rwxSettings) (ctrl.Result, error) {
	opts := []client.DeleteOption{client.Preconditions{UID: &pod.UID}}
	var res ctrl.Result
	if !pod.DeletionTimestamp.IsZero() {
		left, held, _, err := r.leaseLeft(ctx, volume, pod, rwx)
		if err != nil || !rwx.fastFailover || !held {
			return res, err
		}
		if left > 0 {
			return ctrl.Result{RequeueAfter: left + 100*time.Millisecond}, nil
		}
		opts = append(opts, client.GracePeriodSeconds(0))
	}
	log.Info("stopping share manager: no workload uses the volume", "pod", pod.Name, "force", len(opts) > 1)
	if err := r.Client.Delete(ctx, pod, opts...); client.IgnoreNotFound(err) != nil {
		return res, fmt.Errorf("delete pod %s: %w", pod.Name, err)
	}
	return res, nil
}

// failover gives up on a share manager that failed or lost its Lease: it
// says so (state error), asks workloads to remount, and removes the pod,
// forcibly with fast failover (its node may be gone and never confirm), so
// that the next reconcile starts a new one away from that node.
func (r *Reconciler) failover(ctx context.Context, log logr.Logger, sm *v1.ShareManager, vol *v1.Volume, pod *corev1.Pod,
	rwx rwxSettings, reason, why string) (ctrl.Result, error) {
	// State error means this pod's failure was told already (the state
	// leaves error only once a new pod exists): a retry only deletes.
	if sm.Status.State != v1.ShareError {
		orig := sm.DeepCopy()
		sm.Status.FailedNode = pod.Spec.NodeName
		sm.Status.Failovers++
		setState(sm, v1.ShareError, pod.Spec.NodeName, reason, why)
		if err := r.Client.Status().Patch(ctx, sm, client.MergeFrom(orig)); err != nil {
			return ctrl.Result{}, client.IgnoreNotFound(err)
		}
		r.Metrics.FailedOver(reason)
		r.failedAt.Put(vol.Name, r.Clock.Now())
		log.Info("share manager failed: replacing it", "pod", pod.Name, "node", pod.Spec.NodeName, "reason", reason, "why", why)
		if r.Recorder != nil {
			r.Recorder.Event(sm, corev1.EventTypeWarning, reason, why)
		}
		if err := r.requestRemount(ctx, vol); err != nil {
			return ctrl.Result{}, err
		}
	}
	opts := []client.DeleteOption{client.Preconditions{UID: &pod.UID}}
	if rwx.fastFailover {
		opts = append(opts, client.GracePeriodSeconds(0))
	}
	if err := r.Client.Delete(ctx, pod, opts...); client.IgnoreNotFound(err) != nil {
		return ctrl.Result{}, fmt.Errorf("delete failed pod %s: %w", pod.Name, err)
	}
	// The delete event of the pod brings the next reconcile; the requeue
	// covers a graceful delete that takes its time.
	return ctrl.Result{RequeueAfter: time.Second}, nil
}

// requestRemount sets the Volume's remountRequestedAt: nodes remount the
// share once its state is running again.
func (r *Reconciler) requestRemount(ctx context.Context, vol *v1.Volume) error {
	orig := vol.DeepCopy()
	now := metav1.NewTime(r.Clock.Now())
	vol.Status.RemountRequestedAt = &now
	if err := r.Client.Status().Patch(ctx, vol, client.MergeFrom(orig)); err != nil {
		return client.IgnoreNotFound(err)
	}
	return nil
}

// failure says why the pod is lost to the share (reason, why), "" when it
// is not.
func failure(pod *corev1.Pod, lapsed bool, rwx rwxSettings) (reason, why string) {
	switch pod.Status.Phase {
	case corev1.PodSucceeded:
		if !pod.DeletionTimestamp.IsZero() {
			// Told to stop (its share was no longer needed, or someone
			// deleted it), it stopped cleanly: a workload that needs the
			// share again meanwhile waits for the next pod. No failover,
			// and no remount asked of anyone.
			return "", ""
		}
		fallthrough
	case corev1.PodFailed:
		// Succeeded too: a share manager only exits 0 when told to stop.
		msg := pod.Status.Message
		if msg == "" {
			msg = "exited"
		}
		return reasonPodFailed, fmt.Sprintf("pod %s on node %s %s: %s", pod.Name, pod.Spec.NodeName, pod.Status.Phase, msg)
	}
	if lapsed {
		return reasonLeaseExpired, fmt.Sprintf("pod %s on node %s did not renew its Lease for %s", pod.Name, pod.Spec.NodeName, rwx.leaseDuration)
	}
	return "", ""
}

// leaseLeft is how long the share's Lease still holds for pod by this
// clock; held is false while the pod does not hold it: not taken yet (the
// share manager waits for its device first) or released (it stops cleanly).
// Once taken, a lapse counts whether or not the pod still looks ready: a
// lost node's pods turn unready long before they go. With no Lease at all,
// a ready pod's readiness time stands in for its last renewal (the share
// manager takes the Lease before it is ready).
func (r *Reconciler) leaseLeft(ctx context.Context, volume string, pod *corev1.Pod, rwx rwxSettings) (left time.Duration, held bool, rep report, err error) {
	var last time.Time
	lease := &coordinationv1.Lease{}
	switch err := r.Client.Get(ctx, client.ObjectKey{Namespace: pod.Namespace, Name: volume}, lease); {
	case err == nil:
		r.observe(volume, lease)
		if ptr.Deref(lease.Spec.HolderIdentity, "") == leaseHolder(pod) && lease.Spec.RenewTime != nil {
			last = lease.Spec.RenewTime.Time
			rep = report{size: reportedSize(lease), nodes: reportedNodes(lease)}
		}
	case !apierrors.IsNotFound(err):
		return 0, false, rep, fmt.Errorf("read Lease %s: %w", volume, err)
	default:
		r.seen.Take(volume)
		if podReady(pod) {
			for _, c := range pod.Status.Conditions {
				if c.Type == corev1.PodReady {
					last = c.LastTransitionTime.Time
				}
			}
		}
	}
	if last.IsZero() {
		return rwx.leaseDuration, false, rep, nil
	}
	return last.Add(rwx.leaseDuration).Sub(r.Clock.Now()), true, rep, nil
}

// report is what the holder of a share's Lease reported on it.
type report struct {
	size *resource.Quantity
	// nodes are the nodes its ganesha admits; nil: no report.
	nodes []string
}

// reportedNodes are the nodes the holder of lease admits (nil: no report).
func reportedNodes(lease *coordinationv1.Lease) []string {
	s, ok := lease.Annotations[v1.ShareClientsAnnotation]
	if !ok {
		return nil
	}
	nodes := []string{}
	for n := range strings.SplitSeq(s, ",") {
		if n != "" {
			nodes = append(nodes, n)
		}
	}
	return nodes
}

// admittedNodes are the nodes pod's share admits: those it reported. A pod
// made before client lists (no --share-manager) serves every client, so it
// admits all of spec.clients.
func admittedNodes(sm *v1.ShareManager, pod *corev1.Pod, rep report) []string {
	if !slices.ContainsFunc(pod.Spec.Containers[0].Args, func(a string) bool { return strings.HasPrefix(a, "--share-manager=") }) {
		var nodes []string
		for _, c := range sm.Spec.Clients {
			nodes = append(nodes, c.Node)
		}
		return nodes
	}
	return rep.nodes
}

// setAdmitted records the nodes the running share admits.
func (r *Reconciler) setAdmitted(ctx context.Context, sm *v1.ShareManager, nodes []string) error {
	if slices.Equal(sm.Status.AdmittedNodes, nodes) {
		return nil
	}
	orig := sm.DeepCopy()
	sm.Status.AdmittedNodes = nodes
	return client.IgnoreNotFound(r.Client.Status().Patch(ctx, sm, client.MergeFrom(orig)))
}

// reportedSize is the size the holder of lease reported (nil: none, or
// not a number of bytes).
func reportedSize(lease *coordinationv1.Lease) *resource.Quantity {
	n, err := strconv.ParseInt(lease.Annotations[v1.ShareSizeAnnotation], 10, 64)
	if err != nil || n <= 0 {
		return nil
	}
	return resource.NewQuantity(n, resource.BinarySI)
}

// setSize records the size the running share manager reported; with no
// report the last one stands.
func (r *Reconciler) setSize(ctx context.Context, sm *v1.ShareManager, size *resource.Quantity) error {
	if size == nil || (sm.Status.Size != nil && sm.Status.Size.Cmp(*size) == 0) {
		return nil
	}
	orig := sm.DeepCopy()
	sm.Status.Size = size
	return client.IgnoreNotFound(r.Client.Status().Patch(ctx, sm, client.MergeFrom(orig)))
}

func podReady(pod *corev1.Pod) bool {
	if pod.Status.Phase != corev1.PodRunning {
		return false
	}
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// workloads are the nodes that hold the volume for a workload pod in its
// Attachment: the share is needed while there is one.
func (r *Reconciler) workloads(ctx context.Context, volume, namespace string) ([]string, error) {
	att := &v1.Attachment{}
	if err := r.Client.Get(ctx, client.ObjectKey{Name: volume}, att); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, nil
		}
		return nil, fmt.Errorf("read Attachment %s: %w", volume, err)
	}
	return workloadNodes(att, volume, namespace), nil
}

// rwxSettings are a StorageCluster's spec.rwx with defaults applied.
type rwxSettings struct {
	fastFailover         bool
	leaseDuration, grace time.Duration
	// stageSecret is the Secret with the cephx client a ceph cluster's
	// nodes stage with (its classes name it; nil on other backends).
	stageSecret *corev1.SecretReference
	// cluster is the volume's StorageCluster (nil: gone).
	cluster *v1.StorageCluster
	// resources of the share-manager container.
	resources corev1.ResourceRequirements
}

// defaultResources are a share manager's without spec.rwx.shareManagerResources.
func defaultResources() corev1.ResourceRequirements {
	return corev1.ResourceRequirements{
		Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("100m"), corev1.ResourceMemory: resource.MustParse("128Mi")},
		Limits:   corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("1"), corev1.ResourceMemory: resource.MustParse("1Gi")},
	}
}

func (r *Reconciler) settings(ctx context.Context, vol *v1.Volume) (rwxSettings, error) {
	s := rwxSettings{fastFailover: true, leaseDuration: 10 * time.Second, grace: share.DefaultGracePeriod, resources: defaultResources()}
	sc := &v1.StorageCluster{}
	if err := r.Client.Get(ctx, client.ObjectKey{Name: vol.Spec.StorageCluster}, sc); err != nil {
		if apierrors.IsNotFound(err) {
			return s, nil
		}
		return s, fmt.Errorf("read StorageCluster %s: %w", vol.Spec.StorageCluster, err)
	}
	s.cluster = sc
	if f := sc.Spec.RWX.FastFailover; f != nil {
		s.fastFailover = *f
	}
	if d := sc.Spec.RWX.LeaseDurationSeconds; d != nil {
		s.leaseDuration = time.Duration(*d) * time.Second
	}
	if g := sc.Spec.RWX.NFSGraceSeconds; g != nil {
		// Never below the NFS lease (a cluster made when the default
		// grace was 10 s holds 10).
		s.grace = max(time.Duration(*g)*time.Second, share.DefaultLeaseLifetime)
	}
	if r := sc.Spec.RWX.ShareManagerResources; r != nil {
		s.resources = *r.DeepCopy()
	}
	if sc.Spec.Backend == v1.BackendCeph && sc.Spec.Ceph != nil {
		node := sc.Spec.Ceph.NodeStageSecret()
		s.stageSecret = &corev1.SecretReference{Name: node.Name, Namespace: node.Namespace}
	}
	return s, nil
}

// claimRetry is how often a share start looks again at a claim being
// made anew (its old PersistentVolume and claim still going).
const claimRetry = time.Second

// ensureClaim makes the share-manager pod's PersistentVolume (owned by the
// Volume: cluster-scoped like it) and claim (owned by the ShareManager),
// and tells whether both are there for a pod. A PersistentVolume made
// before the share device handle (volid.ShareDevice), with the volume ID
// as its handle, is one volume with the claim's to kubelet (issue #33):
// it and its claim are deleted (Retain: the image stays) and made anew
// once gone. That is safe only here, where no share-manager pod exists.
func (r *Reconciler) ensureClaim(ctx context.Context, log logr.Logger, sm *v1.ShareManager, vol *v1.Volume, rwx rwxSettings) (bool, error) {
	pv, pvc := volumeFor(sm, vol, rwx.stageSecret), claimFor(sm, vol)
	if err := controllerutil.SetControllerReference(vol, pv, r.Client.Scheme()); err != nil {
		return false, err
	}
	if err := controllerutil.SetControllerReference(sm, pvc, r.Client.Scheme()); err != nil {
		return false, err
	}
	if err := r.Client.Create(ctx, pv); apierrors.IsAlreadyExists(err) {
		if ready, err := r.replaceOldClaim(ctx, log, pv, pvc); err != nil || !ready {
			return false, err
		}
	} else if err != nil {
		return false, fmt.Errorf("create PersistentVolume %s: %w", pv.Name, err)
	}
	if err := r.Client.Create(ctx, pvc); err != nil && !apierrors.IsAlreadyExists(err) {
		return false, fmt.Errorf("create PersistentVolumeClaim %s: %w", pvc.Name, err)
	}
	return true, nil
}

// replaceOldClaim looks at the share's existing PersistentVolume: ready
// when it is want's; while an old one (another handle) exists, it and
// its claim are deleted, and the start waits.
func (r *Reconciler) replaceOldClaim(ctx context.Context, log logr.Logger, want *corev1.PersistentVolume, pvc *corev1.PersistentVolumeClaim) (bool, error) {
	reader := r.Reader
	if reader == nil {
		reader = r.Client
	}
	have := &corev1.PersistentVolume{}
	if err := reader.Get(ctx, client.ObjectKeyFromObject(want), have); err != nil {
		return false, client.IgnoreNotFound(err) // gone meanwhile: made at the next try
	}
	if have.Spec.CSI != nil && have.Spec.CSI.VolumeHandle == want.Spec.CSI.VolumeHandle && have.DeletionTimestamp.IsZero() {
		return true, nil
	}
	if !have.DeletionTimestamp.IsZero() {
		return false, nil
	}
	log.Info("replacing the share's PersistentVolume and claim: made with the volume's own handle",
		"persistentVolume", have.Name, "handle", handleOf(have), "want", want.Spec.CSI.VolumeHandle)
	if err := r.Client.Delete(ctx, pvc); client.IgnoreNotFound(err) != nil {
		return false, fmt.Errorf("delete PersistentVolumeClaim %s: %w", pvc.Name, err)
	}
	uid := have.UID
	if err := r.Client.Delete(ctx, have, client.Preconditions{UID: &uid}); client.IgnoreNotFound(err) != nil {
		return false, fmt.Errorf("delete PersistentVolume %s: %w", have.Name, err)
	}
	return false, nil
}

// handleOf is pv's CSI volume handle, "" when it has none.
func handleOf(pv *corev1.PersistentVolume) string {
	if pv.Spec.CSI == nil {
		return ""
	}
	return pv.Spec.CSI.VolumeHandle
}

func (r *Reconciler) ensureService(ctx context.Context, sm *v1.ShareManager) error {
	want := serviceFor(sm)
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: want.Name, Namespace: want.Namespace}}
	_, err := controllerutil.CreateOrPatch(ctx, r.Client, svc, func() error {
		svc.Labels = want.Labels
		svc.Spec.Selector = want.Spec.Selector
		svc.Spec.Ports = want.Spec.Ports
		return controllerutil.SetControllerReference(sm, svc, r.Client.Scheme())
	})
	if err != nil {
		return fmt.Errorf("service %s: %w", want.Name, err)
	}
	return nil
}

// setStatus writes state, node, endpoint and the Ready condition when they
// changed; each change is its own write, so watchers see every transition.
func (r *Reconciler) setStatus(ctx context.Context, sm *v1.ShareManager, state v1.ShareState, node, reason, msg string) error {
	orig := sm.DeepCopy()
	setState(sm, state, node, reason, msg)
	if equality.Semantic.DeepEqual(orig.Status, sm.Status) {
		return nil
	}
	if err := r.Client.Status().Patch(ctx, sm, client.MergeFrom(orig)); err != nil {
		return client.IgnoreNotFound(err)
	}
	return nil
}

func setState(sm *v1.ShareManager, state v1.ShareState, node, reason, msg string) {
	sm.Status.State, sm.Status.OwnerID, sm.Status.Endpoint = state, node, ""
	if state != v1.ShareRunning {
		sm.Status.AdmittedNodes = nil // no share, no one admitted
	}
	if state == v1.ShareRunning {
		sm.Status.Endpoint = Endpoint(sm.Namespace, sm.Spec.Volume)
	}
	meta.SetStatusCondition(&sm.Status.Conditions, metav1.Condition{
		Type: v1.ConditionReady, Status: readyStatus(state), ObservedGeneration: sm.Generation, Reason: reason, Message: msg,
	})
}

func readyStatus(s v1.ShareState) metav1.ConditionStatus {
	if s == v1.ShareRunning {
		return metav1.ConditionTrue
	}
	return metav1.ConditionFalse
}

// What it reads to decide: its ShareManagers, their Volumes (and sets
// remountRequestedAt), Attachments (who needs the share), StorageClusters
// (spec.rwx).
// +kubebuilder:rbac:groups=berth.io,namespace=berth-system,resources=sharemanagers,verbs=get;list;watch
// +kubebuilder:rbac:groups=berth.io,namespace=berth-system,resources=sharemanagers/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=berth.io,namespace=berth-system,resources=sharemanagers/finalizers,verbs=update
// +kubebuilder:rbac:groups=berth.io,resources=volumes,verbs=get;list;watch
// +kubebuilder:rbac:groups=berth.io,resources=volumes/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=berth.io,resources=attachments,verbs=get;list;watch
// +kubebuilder:rbac:groups=berth.io,resources=storageclusters,verbs=get;list;watch
// The share's clients: its workload nodes' addresses, as Nodes and the
// multus holder pods (in its namespace) have them; spec.clients is set.
// +kubebuilder:rbac:groups="",resources=nodes,verbs=get;list;watch
// +kubebuilder:rbac:groups=berth.io,namespace=berth-system,resources=sharemanagers,verbs=patch
//
// (finalizers: a controller reference blocks owner deletion, which needs it
// where OwnerReferencesPermissionEnforcement is on.)
// What it runs, in the operator's namespace only: the pod (force-deleted
// on failover), its claim (and the claim's PersistentVolume, read to
// replace one made with an older handle), the Service, and an Event per
// failover; Leases are only read.
// +kubebuilder:rbac:groups="",namespace=berth-system,resources=pods,verbs=get;list;watch;create;delete
// +kubebuilder:rbac:groups="",namespace=berth-system,resources=persistentvolumeclaims,verbs=create;delete
// +kubebuilder:rbac:groups="",resources=persistentvolumes,verbs=get;create;delete
// +kubebuilder:rbac:groups="",namespace=berth-system,resources=services,verbs=get;list;watch;create;update;patch
// +kubebuilder:rbac:groups=coordination.k8s.io,namespace=berth-system,resources=leases,verbs=get;list;watch
// +kubebuilder:rbac:groups="",namespace=berth-system,resources=events,verbs=create;patch

// SetupWithManager registers the reconciler: its pods and Services, the
// Volumes and the Leases and Attachments named after them all wake the
// ShareManager they concern; a Node's address change and multus holder
// pods wake them all (their clients' addresses). A Volume wakes it when its spec changes or
// its deletion starts or ends (a Volume on its way out needs no share, and
// its image waits for the share manager's stage: a share left starting,
// with no Lease or pod change to come, would hold it for good); its status
// (the share state mirrored into it) does not.
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager) error {
	byVolume := func(_ context.Context, o client.Object) []reconcile.Request {
		return []reconcile.Request{{NamespacedName: client.ObjectKey{Namespace: r.Options.Namespace, Name: o.GetName()}}}
	}
	volumeChanged := predicate.Funcs{UpdateFunc: func(e event.UpdateEvent) bool {
		return e.ObjectOld.GetGeneration() != e.ObjectNew.GetGeneration() ||
			e.ObjectOld.GetDeletionTimestamp().IsZero() != e.ObjectNew.GetDeletionTimestamp().IsZero()
	}}
	return ctrl.NewControllerManagedBy(mgr).
		For(&v1.ShareManager{}).
		Owns(&corev1.Pod{}).
		Owns(&corev1.Service{}).
		Watches(&v1.Volume{}, handler.EnqueueRequestsFromMapFunc(byVolume), builder.WithPredicates(volumeChanged)).
		Watches(&coordinationv1.Lease{}, handler.EnqueueRequestsFromMapFunc(byVolume)).
		Watches(&v1.Attachment{}, handler.EnqueueRequestsFromMapFunc(byVolume)).
		Watches(&corev1.Node{}, handler.EnqueueRequestsFromMapFunc(r.allShares), builder.WithPredicates(addressesChanged)).
		Watches(&corev1.Pod{}, handler.EnqueueRequestsFromMapFunc(r.allShares), builder.WithPredicates(holderPod)).
		Named("sharemanager").
		Complete(r)
}

// allShares is every ShareManager of the namespace.
func (r *Reconciler) allShares(ctx context.Context, _ client.Object) []reconcile.Request {
	list := &v1.ShareManagerList{}
	if err := r.Client.List(ctx, list, client.InNamespace(r.Options.Namespace)); err != nil {
		r.Log.Error(err, "list ShareManagers")
		return nil
	}
	reqs := make([]reconcile.Request, 0, len(list.Items))
	for _, sm := range list.Items {
		reqs = append(reqs, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&sm)})
	}
	return reqs
}

// addressesChanged passes Node events that may change a share's clients.
var addressesChanged = predicate.Funcs{UpdateFunc: func(e event.UpdateEvent) bool {
	o, ok1 := e.ObjectOld.(*corev1.Node)
	n, ok2 := e.ObjectNew.(*corev1.Node)
	return !ok1 || !ok2 || !equality.Semantic.DeepEqual(o.Status.Addresses, n.Status.Addresses)
}}

// holderPod passes multus holder pods' events.
var holderPod = predicate.NewPredicateFuncs(func(o client.Object) bool {
	return o.GetLabels()[labelComponent] == componentHolder
})
