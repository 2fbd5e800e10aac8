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
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	v1 "github.com/berth-io/berth/api/v1alpha1"
)

// observed is what apply found (or made) of the owned workloads, for status.
type observed struct {
	agent, keeper *appsv1.DaemonSet
	controller    *appsv1.Deployment
}

// apply creates or updates every owned object. It keeps going after an
// error so that one conflicting object does not hold back the others.
func (r *Reconciler) apply(ctx context.Context, sc *v1.StorageCluster) (observed, error) {
	var obs observed
	var errs []error

	obs.agent = &appsv1.DaemonSet{ObjectMeta: r.meta(sc, componentAgent)}
	errs = append(errs, r.ensure(ctx, sc, obs.agent, func() { r.agentDaemonSet(sc, obs.agent) }))
	obs.keeper = &appsv1.DaemonSet{ObjectMeta: r.meta(sc, componentKeeper)}
	errs = append(errs, r.ensure(ctx, sc, obs.keeper, func() { r.keeperDaemonSet(sc, obs.keeper) }))
	obs.controller = &appsv1.Deployment{ObjectMeta: r.meta(sc, componentController)}
	errs = append(errs, r.ensure(ctx, sc, obs.controller, func() { r.controllerDeployment(sc, obs.controller) }))

	for component, port := range map[string]int32{componentAgent: AgentMetricsPort, componentController: ControllerMetricsPort} {
		svc := &corev1.Service{ObjectMeta: r.metricsServiceMeta(sc, component)}
		errs = append(errs, r.ensure(ctx, sc, svc, func() { r.metricsService(sc, component, port, svc) }))
	}

	drv := &storagev1.CSIDriver{}
	drv.Name = v1.DriverName
	errs = append(errs, r.ensure(ctx, sc, drv, func() { csiDriver(sc, drv) }))
	for _, m := range []v1.Mounter{v1.MounterKernel, v1.MounterUserspace} {
		cls := &storagev1.StorageClass{}
		cls.Name = StorageClassName(m)
		errs = append(errs, r.ensure(ctx, sc, cls, func() { r.storageClass(sc, cls, m) }))
	}
	errs = append(errs, r.ensureSnapshotClass(ctx, sc))
	return obs, errors.Join(errs...)
}

// ensure creates obj or brings it to what mutate sets, as a controlled
// dependent of sc. An object controlled by someone else is left alone.
func (r *Reconciler) ensure(ctx context.Context, sc *v1.StorageCluster, obj client.Object, mutate func()) error {
	_, err := controllerutil.CreateOrUpdate(ctx, r.Client, obj, func() error {
		read := obj.DeepCopyObject()
		mutate()
		if err := controllerutil.SetControllerReference(sc, obj, r.Client.Scheme()); err != nil {
			return err
		}
		// Rendering replaces whole specs, dropping the defaults the API
		// server filled in, so the object never equals what was read. When
		// every field we set already holds our value, keep the object as
		// read: no update is sent on a reconcile that changes nothing.
		if obj.GetResourceVersion() != "" && equality.Semantic.DeepDerivative(obj, read) {
			reflect.ValueOf(obj).Elem().Set(reflect.ValueOf(read).Elem())
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("%T %s: %w", obj, obj.GetName(), err)
	}
	return nil
}
