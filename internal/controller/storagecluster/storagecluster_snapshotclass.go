package storagecluster

import (
	"context"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	v1 "github.com/berth-io/berth/api/v1alpha1"
)

// SnapshotClassName is the VolumeSnapshotClass of a cluster's volumes,
// named as its kernel StorageClass (the cluster's name).
func SnapshotClassName(cluster string) string { return cluster }

// The VolumeSnapshot API is not part of Kubernetes: a distribution (or the
// admin) installs its CRDs and snapshot-controller, before or after berth.
// The class is made only where the API is served, and berth needs no Go
// types of it: the class is two fields.
var (
	snapshotClassGVK = schema.GroupVersionKind{Group: "snapshot.storage.k8s.io", Version: "v1", Kind: "VolumeSnapshotClass"}
	// snapshotClassCRD is the CRD whose arrival (or return) makes every
	// StorageCluster reconcile, so that its class appears then.
	snapshotClassCRD = "volumesnapshotclasses.snapshot.storage.k8s.io"
	crdGVK           = schema.GroupVersionKind{Group: "apiextensions.k8s.io", Version: "v1", Kind: "CustomResourceDefinition"}
)

const defaultSnapshotClassAnnotation = "snapshot.storage.kubernetes.io/is-default-class"

// snapshotClass renders the VolumeSnapshotClass. Driver, deletion policy and
// the default mark are set when it is made; an admin may change them after
// (the default mark is per driver: it picks this class for snapshots of
// berth volumes that name none, whatever other drivers' classes say; only
// the oldest cluster's class gets it, first).
func snapshotClass(sc *v1.StorageCluster, cls *unstructured.Unstructured, first bool) {
	labels := cls.GetLabels()
	if labels == nil {
		labels = map[string]string{}
	}
	for k, v := range objectLabels(sc.Name, componentController) {
		labels[k] = v
	}
	cls.SetLabels(labels)
	if cls.GetResourceVersion() != "" {
		return
	}
	if first {
		cls.SetAnnotations(map[string]string{defaultSnapshotClassAnnotation: "true"})
	}
	cls.Object["driver"] = v1.DriverName
	cls.Object["deletionPolicy"] = "Delete"
}

// snapshotAPIRetry is how soon a cluster is reconciled again when the
// VolumeSnapshotClass CRD is installed but the API server's discovery does
// not serve it yet: no further CRD event comes to bring it back.
const snapshotAPIRetry = 2 * time.Second

// ensureSnapshotClass makes the VolumeSnapshotClass where the snapshot API
// is served; without it there is nothing to do (the CRD watch comes back
// when it is installed). pending says that the CRD is there but its API is
// not served yet: the caller reconciles again soon.
func (r *Reconciler) ensureSnapshotClass(ctx context.Context, sc *v1.StorageCluster, first bool) (pending bool, err error) {
	cls := &unstructured.Unstructured{}
	cls.SetGroupVersionKind(snapshotClassGVK)
	cls.SetName(SnapshotClassName(sc.Name))
	err = r.ensure(ctx, sc, cls, func() { snapshotClass(sc, cls, first) })
	// NotFound on a create: the CRD went away after the client's REST
	// mapper cached it (the create's URL itself is unknown).
	if meta.IsNoMatchError(err) || apierrors.IsNotFound(err) {
		if r.snapshotCRDInstalled(ctx) {
			r.Log.V(1).Info("VolumeSnapshotClass CRD installed, its API not served yet: trying again", "storageCluster", sc.Name, "after", snapshotAPIRetry)
			return true, nil
		}
		r.Log.V(1).Info("no VolumeSnapshot API in this cluster: no VolumeSnapshotClass", "storageCluster", sc.Name)
		return false, nil
	}
	return false, err
}

// snapshotCRDInstalled tells whether the VolumeSnapshotClass CRD exists and
// is not being deleted (read errors count as "no": the CRD watch still
// brings the cluster back).
func (r *Reconciler) snapshotCRDInstalled(ctx context.Context) bool {
	crd := &metav1.PartialObjectMetadata{}
	crd.SetGroupVersionKind(crdGVK)
	if err := r.Client.Get(ctx, client.ObjectKey{Name: snapshotClassCRD}, crd); err != nil {
		return false
	}
	return crd.DeletionTimestamp.IsZero()
}

// watchSnapshotClasses makes b reconcile every StorageCluster when the
// VolumeSnapshotClass CRD comes or goes and, where the API is already
// served, a cluster whose class someone changed or deleted. (An Owns of a
// kind that is not served would keep the controller from starting.)
func (r *Reconciler) watchSnapshotClasses(b *builder.Builder, mapper meta.RESTMapper) *builder.Builder {
	crd := &metav1.PartialObjectMetadata{}
	crd.SetGroupVersionKind(crdGVK)
	b = b.WatchesMetadata(crd, handler.EnqueueRequestsFromMapFunc(r.allClusters),
		builder.WithPredicates(predicate.NewPredicateFuncs(func(o client.Object) bool { return o.GetName() == snapshotClassCRD })))
	if _, err := mapper.RESTMapping(snapshotClassGVK.GroupKind(), snapshotClassGVK.Version); err == nil {
		cls := &metav1.PartialObjectMetadata{}
		cls.SetGroupVersionKind(snapshotClassGVK)
		b = b.Owns(cls, builder.OnlyMetadata)
	}
	return b
}

// allClusters maps an event to every StorageCluster.
func (r *Reconciler) allClusters(ctx context.Context, _ client.Object) []reconcile.Request {
	var list v1.StorageClusterList
	if err := r.Client.List(ctx, &list); err != nil {
		r.Log.Error(err, "listing StorageClusters for the VolumeSnapshot API")
		return nil
	}
	reqs := make([]reconcile.Request, 0, len(list.Items))
	for _, sc := range list.Items {
		reqs = append(reqs, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&sc)})
	}
	return reqs
}
