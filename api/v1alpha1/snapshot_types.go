package v1alpha1

import (
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// SnapshotSpec is the wanted state of one point-in-time copy of a volume.
type SnapshotSpec struct {
	// SourceVolume is the name of the Volume copied.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="sourceVolume is immutable"
	SourceVolume string `json:"sourceVolume"`

	// Node holds the source volume and so the snapshot; empty for a
	// snapshot in Ceph, which no node holds.
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="node is immutable"
	Node string `json:"node"`

	// VolumeMode is the source volume's mode: a restore must ask the same.
	// Empty on snapshots taken before berth recorded it.
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="volumeMode is immutable"
	// +optional
	VolumeMode VolumeMode `json:"volumeMode,omitempty"`
}

// SnapshotStatus is the observed state of a snapshot.
type SnapshotStatus struct {
	// ReadyToUse is true once the copy is complete.
	// +optional
	ReadyToUse bool `json:"readyToUse,omitempty"`

	// Size of the snapshot, the source volume's size when taken.
	// +optional
	Size *resource.Quantity `json:"size,omitempty"`

	// CreatedAt is when the copy was taken.
	// +optional
	CreatedAt *metav1.Time `json:"createdAt,omitempty"`

	// Message explains a failure.
	// +optional
	Message string `json:"message,omitempty"`

	// Conditions tell whether the copy is ready, and if not why (reason
	// NoSpace: the node lacks the room for it).
	// +listType=map
	// +listMapKey=type
	// +optional
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// Snapshot is a point-in-time copy of a Volume, kept on the volume's node.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:storageversion
// +kubebuilder:resource:scope=Cluster,shortName=bsnap,categories=berth
// +kubebuilder:printcolumn:name="Source",type=string,JSONPath=`.spec.sourceVolume`
// +kubebuilder:printcolumn:name="Node",type=string,JSONPath=`.spec.node`
// +kubebuilder:printcolumn:name="Ready",type=boolean,JSONPath=`.status.readyToUse`
// +kubebuilder:printcolumn:name="Size",type=string,JSONPath=`.status.size`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type Snapshot struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec SnapshotSpec `json:"spec"`
	// +optional
	Status SnapshotStatus `json:"status,omitempty"`
}

// SnapshotList is a list of Snapshots.
// +kubebuilder:object:root=true
type SnapshotList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []Snapshot `json:"items"`
}

func init() {
	SchemeBuilder.Register(&Snapshot{}, &SnapshotList{})
}
