// Package storagecluster is the operator's StorageCluster reconciler. It
// deploys one node-wide set for every cluster (the agent and keeper
// DaemonSets, the CSI controller Deployment, their Services and the
// CSIDriver, owned by no cluster: deleting one never removes them; the
// multus mover while any cluster asks for it), and per cluster its
// StorageClasses, (where the snapshot API is served) its
// VolumeSnapshotClass and (multus) its holder DaemonSet; it keeps them as
// specified, reports readiness per cluster, checks its networks, and runs
// a cluster's cleanup rule on deletion.
//
// It lives in its own package so that controller-gen can generate the
// operator's RBAC from its markers alone (the node-side reconcilers in
// internal/controller belong to the agent's role).
package storagecluster

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/go-logr/logr"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/tools/record"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	v1 "github.com/berth-io/berth/api/v1alpha1"
	"github.com/berth-io/berth/internal/fence"
)

// Finalizer keeps a StorageCluster until its cleanup rule is satisfied.
const Finalizer = "berth.io/cleanup"

// DefaultCleanupPoll is how often a deleting cluster rechecks its nodes:
// agent reports arrive as status updates (which trigger a reconcile anyway),
// but Node deletions do not.
const DefaultCleanupPoll = 5 * time.Second

// Options are the operator-wide settings every StorageCluster is rendered with.
type Options struct {
	// Namespace holds the namespaced objects (DaemonSets, Deployment).
	Namespace string
	// Image is berth's image; every component runs it with its command.
	Image string
	// ImagePullPolicy of every container; empty leaves Kubernetes' default.
	ImagePullPolicy corev1.PullPolicy
	// ImagePullSecrets go on every pod the operator renders (a private
	// registry); empty: none.
	ImagePullSecrets []corev1.LocalObjectReference
	// ProvisionerImage, ResizerImage and SnapshotterImage are the CSI sidecars.
	ProvisionerImage string
	ResizerImage     string
	SnapshotterImage string
	// KubeletDir is the kubelet root on the nodes (usually /var/lib/kubelet).
	KubeletDir string
	// VolumePluginDir is kubelet's Flexvolume plugin folder on the nodes.
	// Empty turns Flexvolume off on every node, whatever a cluster's
	// spec.agent.flexvolume asks: the agent neither mounts nor installs
	// into a plugin folder (chart value flexvolume.enabled=false).
	VolumePluginDir string
	// AgentServiceAccount and ControllerServiceAccount run the agent and the
	// CSI controller; the chart creates them with their generated roles.
	AgentServiceAccount      string
	ControllerServiceAccount string
	// APIServerHost and APIServerPort, when set, are passed to berth's pods
	// as KUBERNETES_SERVICE_HOST/PORT (clusters without kube-proxy).
	APIServerHost string
	APIServerPort string
	// DefaultStorageClass marks the kernel-mounter class as the default.
	DefaultStorageClass bool
	// MetricsSecure makes the operator, and the agent and CSI controller it
	// renders, serve /metrics over HTTPS to authorized readers only
	// (--metrics-secure).
	MetricsSecure bool
}

// Validate reports the first missing setting.
func (o Options) Validate() error {
	switch {
	case o.Namespace == "":
		return errors.New("namespace missing")
	case o.Image == "":
		return errors.New("image missing")
	case o.ProvisionerImage == "" || o.ResizerImage == "" || o.SnapshotterImage == "":
		return errors.New("CSI sidecar image missing")
	case o.KubeletDir == "":
		return errors.New("kubelet dir missing")
	case o.AgentServiceAccount == "" || o.ControllerServiceAccount == "":
		return errors.New("service account missing")
	}
	return nil
}

// Reconciler reconciles StorageClusters.
type Reconciler struct {
	Client  client.Client
	Options Options
	Log     logr.Logger
	// CleanupPoll overrides DefaultCleanupPoll when set.
	CleanupPoll time.Duration
	// Direct reads from and writes to the API server uncached, for moving
	// entries off Attachments (fencing decides on fresh reads); nil: Client.
	Direct client.Client
	// Recorder, when set, gets an Event when a deletion stops waiting.
	Recorder record.EventRecorder
	// Blocklister fences the Ceph clients of a node whose entries a
	// deletion that stops waiting moves away (nil: such entries stay, and
	// the deletion waits).
	Blocklister fence.Blocklister
	// Clock: the real one when nil.
	Clock clock.Clock
	// CheckCeph checks a ceph cluster's connection (nil: ceph.Check);
	// LookupHost resolves monitor host names (nil: the system resolver);
	// CephConnectTimeout bounds its steps (0: DefaultCephConnectTimeout).
	CheckCeph          CephCheck
	LookupHost         func(ctx context.Context, host string) ([]string, error)
	CephConnectTimeout time.Duration
	// NetworkRecheck is how often a multus cluster's networks are read
	// again (0: DefaultNetworkRecheck).
	NetworkRecheck time.Duration

	cephChecks cephChecks

	// nodeWideMu serialises applying the node-wide set (at start and from
	// reconciles).
	nodeWideMu sync.Mutex
}

// +kubebuilder:rbac:groups=berth.io,resources=storageclusters,verbs=get;list;watch;update;patch
// +kubebuilder:rbac:groups=berth.io,resources=storageclusters/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=berth.io,resources=storageclusters/finalizers,verbs=update
// The workloads live in the operator's namespace only: a Role, which the
// chart moves into the release namespace.
// +kubebuilder:rbac:groups=apps,namespace=berth-system,resources=daemonsets;deployments,verbs=get;list;watch;create;update;patch;delete
// The agent's and CSI controller's scrape Services, in the same namespace.
// +kubebuilder:rbac:groups="",namespace=berth-system,resources=services,verbs=get;list;watch;create;update
// The CSIDriver: list/watch feed the cache and create cannot be limited by
// name; every other write only reaches berth's own.
// +kubebuilder:rbac:groups=storage.k8s.io,resources=csidrivers,verbs=list;watch;create
// +kubebuilder:rbac:groups=storage.k8s.io,resources=csidrivers,verbs=get;update;patch;delete,resourceNames=berth.io
// The classes are named after their cluster, so their names are not known
// in advance: the operator refuses to touch a class it did not make (ErrForeign).
// +kubebuilder:rbac:groups=storage.k8s.io,resources=storageclasses,verbs=get;list;watch;create;update;patch;delete
// The VolumeSnapshotClasses, where the snapshot API is served; the CRDs'
// metadata tell when it is installed.
// +kubebuilder:rbac:groups=snapshot.storage.k8s.io,resources=volumesnapshotclasses,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups=apiextensions.k8s.io,resources=customresourcedefinitions,verbs=get;list;watch

// SetupWithManager registers the reconciler and applies the node-wide set
// at start. Owns() brings back a cluster's classes that someone deletes;
// the node-wide objects, owned by no cluster, are watched by their labels
// (a change re-applies them and refreshes every cluster's status). A Volume
// deleted may let the data dir of a deleted cluster go.
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager) error {
	if err := r.Options.Validate(); err != nil {
		return fmt.Errorf("storagecluster options: %w", err)
	}
	nodeWide := handler.EnqueueRequestsFromMapFunc(r.nodeWideEvents)
	b := ctrl.NewControllerManagedBy(mgr).
		For(&v1.StorageCluster{}).
		Watches(&appsv1.DaemonSet{}, nodeWide).
		Watches(&appsv1.Deployment{}, nodeWide).
		Watches(&policyv1.PodDisruptionBudget{}, nodeWide).
		Watches(&corev1.Service{}, nodeWide).
		Watches(&storagev1.CSIDriver{}, nodeWide).
		Watches(&v1.Volume{}, handler.EnqueueRequestsFromMapFunc(func(context.Context, client.Object) []reconcile.Request {
			return []reconcile.Request{nodeWideRequest}
		}), builder.WithPredicates(predicate.Funcs{
			CreateFunc: func(event.CreateEvent) bool { return false },
			UpdateFunc: func(event.UpdateEvent) bool { return false },
			DeleteFunc: func(event.DeleteEvent) bool { return true },
		})).
		Owns(&storagev1.StorageClass{}).
		Owns(&appsv1.DaemonSet{}). // the holders
		Named("storagecluster")
	if err := mgr.Add(manager.RunnableFunc(r.startNodeWide)); err != nil {
		return err
	}
	return r.watchSnapshotClasses(b, mgr.GetRESTMapper()).Complete(r)
}

// Reconcile implements reconcile.Reconciler.
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	if req == nodeWideRequest {
		_, _, err := r.applyNodeWide(ctx)
		return ctrl.Result{}, err
	}
	sc := &v1.StorageCluster{}
	if err := r.Client.Get(ctx, req.NamespacedName, sc); err != nil {
		if apierrors.IsNotFound(err) {
			// Gone: its data dir leaves the agent once no Volume of it is left.
			_, _, err = r.applyNodeWide(ctx)
		}
		return ctrl.Result{}, err
	}
	log := r.Log.WithValues("storageCluster", sc.Name)
	if !sc.DeletionTimestamp.IsZero() {
		return r.reconcileDelete(ctx, log, sc)
	}
	// A data dir written before the CRD refused it (or past it) never
	// reaches a host path mount.
	if err := v1.ValidateDataDir(sc.Spec.DataDir); err != nil {
		log.Error(err, "refusing the StorageCluster")
		return ctrl.Result{}, r.writeInvalid(ctx, sc, err)
	}
	if controllerutil.AddFinalizer(sc, Finalizer) {
		if err := r.Client.Update(ctx, sc); err != nil {
			return ctrl.Result{}, fmt.Errorf("add finalizer: %w", err)
		}
	}

	obs, plan, nodeWideErr := r.applyNodeWide(ctx)
	if why := plan.refused[sc.Name]; why != nil {
		// The agent does not mount this cluster's data dir: no classes, so
		// that no volume of it is made.
		log.Error(why, "refusing the StorageCluster's data dir")
		r.event(sc, corev1.EventTypeWarning, ReasonDataDirOverlap, why.Error())
		return ctrl.Result{}, r.writeRefused(ctx, sc, why)
	}
	snapshotPending, clusterErr := r.applyCluster(ctx, sc)
	var holderErr error
	obs.holder, holderErr = r.applyHolder(ctx, sc)
	clusterErr = errors.Join(clusterErr, holderErr)
	if errors.Is(clusterErr, ErrForeign) {
		r.event(sc, corev1.EventTypeWarning, ReasonForeignObject, clusterErr.Error())
	}
	applyErr := errors.Join(nodeWideErr, clusterErr)
	if applyErr != nil {
		log.Error(applyErr, "applying objects")
	}
	backendCond, recheck := r.backendCondition(ctx, log, sc)
	netCond, netRecheck := r.networkCondition(ctx, sc)
	if err := r.writeStatus(ctx, sc, obs, applyErr, backendCond, netCond); err != nil {
		return ctrl.Result{}, err
	}
	if applyErr != nil {
		return ctrl.Result{}, applyErr
	}
	recheck = sooner(recheck, netRecheck)
	if snapshotPending {
		recheck = sooner(recheck, snapshotAPIRetry)
	}
	return ctrl.Result{RequeueAfter: recheck}, nil
}

// sooner returns the shorter of two recheck delays, where 0 means none.
func sooner(a, b time.Duration) time.Duration {
	if a == 0 || (b > 0 && b < a) {
		return b
	}
	return a
}

// reconcileDelete runs the cleanup rule and lets the cluster go once it holds.
func (r *Reconciler) reconcileDelete(ctx context.Context, log logr.Logger, sc *v1.StorageCluster) (ctrl.Result, error) {
	if !controllerutil.ContainsFinalizer(sc, Finalizer) {
		return ctrl.Result{}, nil
	}
	pending, err := PendingCleanup(ctx, r.Client, sc)
	if err != nil {
		return ctrl.Result{}, err
	}
	if len(pending) > 0 {
		timeout := DefaultCleanupTimeout
		if t := sc.Spec.CleanupTimeout; t != nil && t.Duration > 0 {
			timeout = t.Duration
		}
		waited := r.clock().Since(sc.DeletionTimestamp.Time)
		if waited < timeout {
			log.Info("waiting for agents to clean up", "nodes", pending, "timeout", timeout)
			if err := r.writeDeleting(ctx, sc, pending); err != nil {
				return ctrl.Result{}, err
			}
			poll := r.CleanupPoll
			if poll <= 0 {
				poll = DefaultCleanupPoll
			}
			return ctrl.Result{RequeueAfter: min(poll, timeout-waited)}, nil
		}
		if err := r.giveUp(ctx, log, sc, pending, timeout); err != nil {
			return ctrl.Result{}, err
		}
	}
	controllerutil.RemoveFinalizer(sc, Finalizer)
	if err := r.Client.Update(ctx, sc); err != nil && !apierrors.IsNotFound(err) {
		return ctrl.Result{}, fmt.Errorf("remove finalizer: %w", err)
	}
	r.cephChecks.forget(sc.UID)
	log.Info("cleanup done, finalizer removed", "policy", sc.Spec.CleanupPolicy)
	return ctrl.Result{}, nil
}
