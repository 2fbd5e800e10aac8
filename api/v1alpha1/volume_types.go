package v1alpha1

import (
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// VolumeSpec is the wanted state of one provisioned volume.
// +kubebuilder:validation:XValidation:rule="self.volumeMode != 'Block' || !has(self.fsType) || size(self.fsType) == 0",message="fsType must be empty for Block volumes"
type VolumeSpec struct {
	// StorageCluster is the cluster this volume belongs to.
	// +kubebuilder:validation:MinLength=1
	StorageCluster string `json:"storageCluster"`

	// Size is the requested capacity. It may only grow.
	// +kubebuilder:validation:XValidation:rule="quantity(string(self)).isGreaterThan(quantity('0'))",message="size must be greater than zero"
	Size resource.Quantity `json:"size"`

	// AccessMode is how the volume may be shared.
	// +kubebuilder:default=ReadWriteOnce
	// +optional
	AccessMode AccessMode `json:"accessMode,omitempty"`

	// VolumeMode is Filesystem (default) or Block.
	// +kubebuilder:default=Filesystem
	// +optional
	VolumeMode VolumeMode `json:"volumeMode,omitempty"`

	// FSType is the filesystem made on a blank Filesystem volume.
	// +kubebuilder:validation:Enum="";ext4;xfs
	// +optional
	FSType string `json:"fsType,omitempty"`

	// Mounter is kernel (a loop device on the image, default) or userspace
	// (berth blockdev, which survives agent restarts without I/O errors).
	// +kubebuilder:default=kernel
	// +optional
	Mounter Mounter `json:"mounter,omitempty"`

	// Node is the node that holds a local volume's image.
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="node is immutable"
	// +optional
	Node string `json:"node,omitempty"`

	// RootSquash, for a ReadWriteMany volume, maps root (uid 0) of the
	// nodes its share serves to the anonymous user (the StorageClass
	// parameter rootSquash: "true"). Off by default: root in a pod is
	// root on the volume, as on a ReadWriteOnce volume.
	// +optional
	RootSquash bool `json:"rootSquash,omitempty"`

	// Source, when set, makes the volume a copy of a snapshot or another volume.
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="source is immutable"
	// +optional
	Source *VolumeSource `json:"source,omitempty"`
}

// VolumeSource names what a new volume is copied from. Exactly one is set.
// +kubebuilder:validation:XValidation:rule="has(self.volume) != has(self.snapshot)",message="exactly one of volume or snapshot must be set"
type VolumeSource struct {
	// Volume is the name of a Volume to clone.
	// +optional
	Volume string `json:"volume,omitempty"`
	// Snapshot is the backend ID of a snapshot to restore.
	// +optional
	Snapshot string `json:"snapshot,omitempty"`
}

// VolumeState is where a volume is in its life.
// +kubebuilder:validation:Enum=Pending;Creating;Available;Expanding;Deleting;Error
type VolumeState string

// Volume states.
const (
	VolumePending   VolumeState = "Pending"
	VolumeCreating  VolumeState = "Creating"
	VolumeAvailable VolumeState = "Available"
	VolumeExpanding VolumeState = "Expanding"
	VolumeDeleting  VolumeState = "Deleting"
	VolumeError     VolumeState = "Error"
)

// ShareState is the state of a read-write-many volume's NFS share; it
// mirrors the ShareManager's state.
// +kubebuilder:validation:Enum=unknown;starting;running;stopping;stopped;error
type ShareState string

// Share (and ShareManager) states.
const (
	ShareUnknown  ShareState = "unknown"
	ShareStarting ShareState = "starting"
	ShareRunning  ShareState = "running"
	ShareStopping ShareState = "stopping"
	ShareStopped  ShareState = "stopped"
	ShareError    ShareState = "error"
)

// VolumeStatus is the observed state of a volume.
type VolumeStatus struct {
	// State is where the volume is in its life.
	// +optional
	State VolumeState `json:"state,omitempty"`

	// Capacity is the size the backend holds now.
	// +optional
	Capacity *resource.Quantity `json:"capacity,omitempty"`

	// Path is the backend location (the image file of a local volume).
	// +optional
	Path string `json:"path,omitempty"`

	// Message explains the state, most of all Error.
	// +optional
	Message string `json:"message,omitempty"`

	// ShareState is the state of the NFS share of a read-write-many volume.
	// +optional
	ShareState ShareState `json:"shareState,omitempty"`

	// ShareEndpoint is the NFS endpoint (nfs://host:port/export) workloads mount.
	// +optional
	ShareEndpoint string `json:"shareEndpoint,omitempty"`

	// ShareNodes are the nodes the running share admits: a workload's
	// node mounts the share once it is listed (ShareManagerStatus.AdmittedNodes).
	// +listType=set
	// +optional
	ShareNodes []string `json:"shareNodes,omitempty"`

	// RemountRequestedAt is set when workloads should remount the share,
	// after a share manager moved.
	// +optional
	RemountRequestedAt *metav1.Time `json:"remountRequestedAt,omitempty"`

	// ObservedGeneration is the spec generation the status describes.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`

	// Formatted is set by the agent once a volume of a node holds a
	// filesystem. Stage never formats a volume that has it: from then on a
	// device that shows no filesystem is unreadable or damaged, not blank.
	// A ceph volume (no node) keeps that record in its RBD image's metadata
	// (berth.formatted) only.
	// +optional
	Formatted *VolumeFormat `json:"formatted,omitempty"`

	// Conditions tell what is ready and what is not.
	// +listType=map
	// +listMapKey=type
	// +optional
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// VolumeFormat records the filesystem a volume holds.
type VolumeFormat struct {
	// FSType is the filesystem staged on the volume.
	// +kubebuilder:validation:MinLength=1
	FSType string `json:"fsType"`
	// Time is when the agent first staged that filesystem (made or found it).
	Time metav1.Time `json:"time"`
}

// Volume is one provisioned berth volume.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:storageversion
// +kubebuilder:resource:scope=Cluster,shortName=bv,categories=berth
// +kubebuilder:printcolumn:name="Size",type=string,JSONPath=`.spec.size`
// +kubebuilder:printcolumn:name="Mode",type=string,JSONPath=`.spec.accessMode`
// +kubebuilder:printcolumn:name="Mounter",type=string,JSONPath=`.spec.mounter`
// +kubebuilder:printcolumn:name="Node",type=string,JSONPath=`.spec.node`
// +kubebuilder:printcolumn:name="State",type=string,JSONPath=`.status.state`
// +kubebuilder:printcolumn:name="Share",type=string,JSONPath=`.status.shareState`,priority=1
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type Volume struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec VolumeSpec `json:"spec"`
	// +optional
	Status VolumeStatus `json:"status,omitempty"`
}

// VolumeList is a list of Volumes.
// +kubebuilder:object:root=true
type VolumeList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []Volume `json:"items"`
}

func init() {
	SchemeBuilder.Register(&Volume{}, &VolumeList{})
}

// ServedOverNFS tells whether the volume's pods reach it through its share
// manager's NFS export: a read-write-many filesystem volume. Only the share
// manager reaches such a volume as a block device.
func (s *VolumeSpec) ServedOverNFS() bool {
	return s.AccessMode == ReadWriteMany && s.VolumeMode != VolumeModeBlock
}

// NeverFormatReason says why the volume must never be formatted as its
// spec and status tell it (a recorded filesystem, a restore, a clone); ""
// when they do not forbid it. A record on the image itself counts too,
// which only the node that reads the image can see.
func (v *Volume) NeverFormatReason() string {
	switch src := v.Spec.Source; {
	case v.Status.Formatted != nil:
		return "its status records a " + v.Status.Formatted.FSType + " filesystem"
	case src != nil && src.Snapshot != "":
		return "it is a copy of snapshot " + src.Snapshot
	case src != nil && src.Volume != "":
		return "it is a clone of volume " + src.Volume
	}
	return ""
}
