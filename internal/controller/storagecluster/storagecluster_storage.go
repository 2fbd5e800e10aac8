package storagecluster

import (
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/utils/ptr"

	v1 "github.com/berth-io/berth/api/v1alpha1"
)

// Parameter and annotation keys the classes carry.
const (
	paramMounter           = "mounter" // read by the CSI controller (csi.ParamMounter)
	defaultClassAnnotation = "storageclass.kubernetes.io/is-default-class"
)

// StorageClassName is the name of the default class for a mounter.
func StorageClassName(m v1.Mounter) string {
	if m == v1.MounterUserspace {
		return "berth-userspace"
	}
	return "berth"
}

// csiDriver renders the CSIDriver. Its spec is immutable in parts, so the
// spec is only written when the object is created.
func csiDriver(sc *v1.StorageCluster, d *storagev1.CSIDriver) {
	setLabels(&d.ObjectMeta, objectLabels(sc, componentController))
	// The scheduler places pods of WaitForFirstConsumer volumes by the
	// CSIStorageCapacity objects the agents publish (mutable: set on update too).
	d.Spec.StorageCapacity = ptr.To(true)
	if d.ResourceVersion != "" {
		return
	}
	d.Spec = storagev1.CSIDriverSpec{
		AttachRequired:       ptr.To(false),
		PodInfoOnMount:       ptr.To(true),
		VolumeLifecycleModes: []storagev1.VolumeLifecycleMode{storagev1.VolumeLifecyclePersistent},
		StorageCapacity:      ptr.To(true),
	}
}

// storageClass renders the default class of mounter m. Provisioner,
// parameters and binding mode cannot change after creation; expansion and
// the default-class annotation can.
func (r *Reconciler) storageClass(sc *v1.StorageCluster, cls *storagev1.StorageClass, m v1.Mounter) {
	setLabels(&cls.ObjectMeta, objectLabels(sc, componentController))
	if m == v1.MounterKernel {
		if r.Options.DefaultStorageClass {
			if cls.Annotations == nil {
				cls.Annotations = map[string]string{}
			}
			cls.Annotations[defaultClassAnnotation] = "true"
		} else {
			delete(cls.Annotations, defaultClassAnnotation)
		}
	}
	cls.AllowVolumeExpansion = ptr.To(true)
	if cls.ResourceVersion != "" {
		return
	}
	cls.Provisioner = v1.DriverName
	cls.Parameters = map[string]string{paramMounter: string(m)}
	cls.ReclaimPolicy = ptr.To(corev1.PersistentVolumeReclaimDelete)
	cls.VolumeBindingMode = ptr.To(storagev1.VolumeBindingWaitForFirstConsumer)
}
