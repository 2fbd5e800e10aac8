package storagecluster

import (
	"maps"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/utils/ptr"

	v1 "github.com/berth-io/berth/api/v1alpha1"
)

// Parameter and annotation keys the classes carry.
const (
	paramMounter           = "mounter"                   // read by the CSI controller (csi.ParamMounter)
	paramFSType            = "csi.storage.k8s.io/fstype" // csi.ParamFSType; the provisioner copies it to the PV
	defaultFSType          = "ext4"                      // the CSI controller's default
	defaultClassAnnotation = "storageclass.kubernetes.io/is-default-class"
	// kubelet reads the Secret these name and hands it to NodeStageVolume:
	// how a ceph volume's cephx key reaches the node, so that agents need
	// no access to Secrets. The CSI controller reads it through the
	// StorageCluster's secretRef itself.
	paramNodeStageSecretName      = "csi.storage.k8s.io/node-stage-secret-name"
	paramNodeStageSecretNamespace = "csi.storage.k8s.io/node-stage-secret-namespace"
)

// StorageClassName is the name of a cluster's class for a mounter: the
// cluster's name, and "<cluster>-userspace" (so the cluster "berth" has
// the classes berth and berth-userspace).
func StorageClassName(cluster string, m v1.Mounter) string {
	if m == v1.MounterUserspace {
		return cluster + "-userspace"
	}
	return cluster
}

// csiDriver renders the CSIDriver, one for every cluster. Its spec is
// immutable in parts, so the spec is only written when the object is created.
func csiDriver(d *storagev1.CSIDriver) {
	setLabels(&d.ObjectMeta, objectLabels(NodeWide, componentController))
	// The scheduler places pods of WaitForFirstConsumer volumes by the
	// CSIStorageCapacity objects the agents publish (mutable: set on update too).
	d.Spec.StorageCapacity = ptr.To(true)
	// kubelet applies a pod's fsGroup to every volume, whatever the PV's
	// fsType and access mode: a non-root pod can write to a fresh volume.
	// Berth does not advertise VOLUME_MOUNT_GROUP, so kubelet does the chown.
	// Mutable since Kubernetes 1.29: set on update too.
	d.Spec.FSGroupPolicy = ptr.To(storagev1.FileFSGroupPolicy)
	if d.ResourceVersion != "" {
		return
	}
	d.Spec = storagev1.CSIDriverSpec{
		AttachRequired:       ptr.To(false),
		PodInfoOnMount:       ptr.To(true),
		VolumeLifecycleModes: []storagev1.VolumeLifecycleMode{storagev1.VolumeLifecyclePersistent},
		StorageCapacity:      ptr.To(true),
		FSGroupPolicy:        ptr.To(storagev1.FileFSGroupPolicy),
	}
}

// storageClass renders the class of mounter m of cluster sc. Provisioner,
// parameters and binding mode cannot change after creation (a class naming
// an old node-stage Secret is made anew, replaceStaleClass); expansion and
// the default-class annotation can. Only the oldest cluster's kernel class
// is the default (first), so that there is one.
func (r *Reconciler) storageClass(sc *v1.StorageCluster, cls *storagev1.StorageClass, m v1.Mounter, first bool) {
	setLabels(&cls.ObjectMeta, objectLabels(sc.Name, componentController))
	if m == v1.MounterKernel {
		if r.Options.DefaultStorageClass && first {
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
	// The fs type the CSI controller defaults to, named so that PVs carry it.
	cls.Parameters = map[string]string{paramMounter: string(m), paramFSType: defaultFSType, v1.ParamStorageCluster: sc.Name}
	maps.Copy(cls.Parameters, nodeStageParams(sc))
	cls.ReclaimPolicy = ptr.To(corev1.PersistentVolumeReclaimDelete)
	cls.VolumeBindingMode = ptr.To(bindingMode(sc))
}

// nodeStageParams are the class parameters that name the Secret kubelet
// hands to NodeStageVolume; none for a local cluster.
func nodeStageParams(sc *v1.StorageCluster) map[string]string {
	if sc.Spec.Backend != v1.BackendCeph || sc.Spec.Ceph == nil {
		return nil
	}
	node := sc.Spec.Ceph.NodeStageSecret()
	return map[string]string{paramNodeStageSecretName: node.Name, paramNodeStageSecretNamespace: node.Namespace}
}

// staleNodeStageSecret tells whether cls, a class of sc, names another
// node-stage Secret than sc does: nodeSecretRef was added to sc after
// cls was made.
func staleNodeStageSecret(sc *v1.StorageCluster, cls *storagev1.StorageClass) bool {
	for k, v := range nodeStageParams(sc) {
		if cls.Parameters[k] != v {
			return true
		}
	}
	return false
}

// bindingMode is a class's volume binding mode. A local volume lives on the
// node its first pod is scheduled to (WaitForFirstConsumer). A ceph volume
// has no node (every node reaches its image), so there is nothing to wait
// for: ceph claims bind at once (Immediate). A ceph class that waits would
// work too: the CSI controller publishes its pool's capacity
// (csi.PoolCapacityPublisher).
func bindingMode(sc *v1.StorageCluster) storagev1.VolumeBindingMode {
	if sc.Spec.Backend == v1.BackendCeph {
		return storagev1.VolumeBindingImmediate
	}
	return storagev1.VolumeBindingWaitForFirstConsumer
}
