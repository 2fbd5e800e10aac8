package storagecluster

import (
	"context"
	"errors"
	"fmt"
	"reflect"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	v1 "github.com/berth-io/berth/api/v1alpha1"
)

// ErrForeign: an object of the name berth would give a cluster's object
// exists and that cluster did not make it (a user's StorageClass, or
// another cluster's). berth never adopts it.
var ErrForeign = errors.New("exists and was not made by this StorageCluster")

// observed is what apply found (or made) of the node-wide workloads, for status.
type observed struct {
	agent, keeper *appsv1.DaemonSet
	controller    *appsv1.Deployment
	// mover is node-wide (no ResourceVersion: none runs); holder is the
	// cluster's own.
	mover, holder *appsv1.DaemonSet
}

// applyCluster creates or updates the objects of one cluster: its
// StorageClasses and VolumeSnapshotClass. It keeps going after an error so
// that one conflicting object does not hold back the others. snapshotPending
// says that the snapshot API is installed but not served yet.
func (r *Reconciler) applyCluster(ctx context.Context, sc *v1.StorageCluster) (snapshotPending bool, _ error) {
	var errs []error
	first, err := r.firstCluster(ctx, sc)
	if err != nil {
		return false, err
	}
	for _, m := range []v1.Mounter{v1.MounterKernel, v1.MounterUserspace} {
		cls := &storagev1.StorageClass{}
		cls.Name = StorageClassName(sc.Name, m)
		if err := r.replaceStaleClass(ctx, sc, cls.Name); err != nil {
			errs = append(errs, err)
			continue
		}
		errs = append(errs, r.ensure(ctx, sc, cls, func() { r.storageClass(sc, cls, m, first) }))
	}
	snapshotPending, err = r.ensureSnapshotClass(ctx, sc, first)
	return snapshotPending, errors.Join(append(errs, err)...)
}

// EventStorageClassReplaced: a class of the cluster was deleted to be
// made anew with the node-stage Secret the cluster names now.
const EventStorageClassReplaced = "StorageClassReplaced"

// replaceStaleClass deletes sc's class name when it names another
// node-stage Secret than sc does (nodeSecretRef was added). A class's
// parameters cannot change, so ensure makes it anew, in this pass or in
// the one its deletion brings. The claims bound before keep their
// PersistentVolumes, which name the Secret they stage with.
func (r *Reconciler) replaceStaleClass(ctx context.Context, sc *v1.StorageCluster, name string) error {
	cls := &storagev1.StorageClass{}
	if err := r.Client.Get(ctx, client.ObjectKey{Name: name}, cls); err != nil {
		return client.IgnoreNotFound(err)
	}
	if c := metav1.GetControllerOf(cls); c == nil || c.UID != sc.UID || !staleNodeStageSecret(sc, cls) {
		return nil
	}
	// The cache may still show a class deleted and made anew: only the
	// one read goes.
	uid := cls.UID
	if err := r.Client.Delete(ctx, cls, client.Preconditions{UID: &uid}); client.IgnoreNotFound(err) != nil {
		return fmt.Errorf("StorageClass %s: delete to make it anew: %w", name, err)
	}
	now := sc.Spec.Ceph.NodeStageSecret()
	msg := fmt.Sprintf("StorageClass %s is made anew to hand the nodes Secret %s/%s (was %s/%s); volumes made before keep theirs",
		name, now.Namespace, now.Name, cls.Parameters[paramNodeStageSecretNamespace], cls.Parameters[paramNodeStageSecretName])
	r.Log.Info(msg)
	if r.Recorder != nil {
		r.Recorder.Event(sc, corev1.EventTypeNormal, EventStorageClassReplaced, msg)
	}
	return nil
}

// firstCluster tells whether sc is the oldest StorageCluster not being
// deleted: its classes carry the default marks (one default per driver).
func (r *Reconciler) firstCluster(ctx context.Context, sc *v1.StorageCluster) (bool, error) {
	var list v1.StorageClusterList
	if err := r.Client.List(ctx, &list); err != nil {
		return false, fmt.Errorf("list StorageClusters: %w", err)
	}
	for i := range list.Items {
		o := &list.Items[i]
		if o.Name == sc.Name || !o.DeletionTimestamp.IsZero() {
			continue
		}
		a, b := o.CreationTimestamp, sc.CreationTimestamp
		if a.Before(&b) || (a.Equal(&b) && o.Name < sc.Name) {
			return false, nil
		}
	}
	return true, nil
}

// ensure creates obj or brings it to what mutate sets, as a controlled
// dependent of sc. An object sc does not control is refused (ErrForeign),
// never adopted.
func (r *Reconciler) ensure(ctx context.Context, sc *v1.StorageCluster, obj client.Object, mutate func()) error {
	return r.createOrUpdate(ctx, obj, func() (bool, error) {
		if obj.GetResourceVersion() != "" {
			if c := metav1.GetControllerOf(obj); c == nil || c.UID != sc.UID {
				owner := "no StorageCluster"
				if c != nil {
					owner = c.Kind + " " + c.Name
				}
				return false, fmt.Errorf("%w (controlled by %s)", ErrForeign, owner)
			}
		}
		mutate()
		return false, controllerutil.SetControllerReference(sc, obj, r.Client.Scheme())
	})
}

// createOrUpdate creates obj or updates it to what mutate sets. mutate
// returns true when it changed the metadata in a way DeepDerivative does
// not see (an owner reference dropped).
func (r *Reconciler) createOrUpdate(ctx context.Context, obj client.Object, mutate func() (bool, error)) error {
	_, err := controllerutil.CreateOrUpdate(ctx, r.Client, obj, func() error {
		read := obj.DeepCopyObject()
		changed, err := mutate()
		if err != nil {
			return err
		}
		// Rendering replaces whole specs, dropping the defaults the API
		// server filled in, so the object never equals what was read. When
		// every field we set already holds our value, keep the object as
		// read: no update is sent on a reconcile that changes nothing.
		if !changed && obj.GetResourceVersion() != "" && equality.Semantic.DeepDerivative(obj, read) {
			reflect.ValueOf(obj).Elem().Set(reflect.ValueOf(read).Elem())
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("%T %s: %w", obj, obj.GetName(), err)
	}
	return nil
}
