package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// CleanupReason says why an attachment entry became stale.
// +kubebuilder:validation:Enum=NodeGone;NodeOutOfService;PodGone;PodMoved;ClusterDeleted
type CleanupReason string

// Reasons for stale attachment entries.
const (
	ReasonNodeGone         CleanupReason = "NodeGone"
	ReasonNodeOutOfService CleanupReason = "NodeOutOfService"
	ReasonPodGone          CleanupReason = "PodGone"
	ReasonPodMoved         CleanupReason = "PodMoved"
	ReasonClusterDeleted   CleanupReason = "ClusterDeleted"
)

// NodeCleanupSpec holds the stale attachment entries of one node.
type NodeCleanupSpec struct {
	// Entries the node's agent must undo: unmount, detach, forget.
	// +listType=map
	// +listMapKey=volume
	// +listMapKey=mountDir
	// +kubebuilder:validation:MaxItems=4096
	// +optional
	Entries []StaleAttachment `json:"entries,omitempty"`

	// Blocklisted are the node's Ceph clients that lock breaking blocklisted
	// (so that a node cut off but still running cannot write to a volume
	// another node now holds). The operator removes them from Ceph's
	// blocklist, and from here, once the node is back, its entries are
	// undone and the cool-down has passed.
	// +listType=map
	// +listMapKey=address
	// +kubebuilder:validation:MaxItems=4096
	// +optional
	Blocklisted []BlocklistedClient `json:"blocklisted,omitempty"`
}

// BlocklistedClient is one Ceph client address of the node on Ceph's blocklist.
type BlocklistedClient struct {
	// Address as Ceph's blocklist takes it ("IP:PORT/NONCE").
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=128
	// +kubebuilder:validation:Pattern=`^[^\s,]+$`
	Address string `json:"address"`

	// Volume whose lock breaking blocklisted it.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=128
	Volume string `json:"volume"`

	// Reason the lock was broken.
	Reason CleanupReason `json:"reason"`

	// BlocklistedAt is when the address was added to the blocklist.
	BlocklistedAt metav1.Time `json:"blocklistedAt"`
}

// StaleAttachment is an attachment entry taken away from its node.
type StaleAttachment struct {
	// Volume whose Attachment held the entry: a volume ID (the rule of internal/volid).
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=128
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`
	Volume string `json:"volume"`

	// MountDir of the entry (the staging path for a stage record), absolute
	// and clean (no ., .., // or trailing /).
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=1024
	// +kubebuilder:validation:Pattern=`^(/[^/]+)+$`
	// +kubebuilder:validation:XValidation:rule="!(self + '/').contains('/./') && !(self + '/').contains('/../')",message="must be a clean absolute path: no . or .. components"
	MountDir string `json:"mountDir"`

	// StagingPath of the volume on the node.
	// +optional
	// +kubebuilder:validation:MaxLength=1024
	// +kubebuilder:validation:Pattern=`^(/[^/]+)+$`
	// +kubebuilder:validation:XValidation:rule="!(self + '/').contains('/./') && !(self + '/').contains('/../')",message="must be a clean absolute path: no . or .. components"
	StagingPath string `json:"stagingPath,omitempty"`

	// Pod held the entry, as namespace/name (a DNS label, which an
	// Attachment entry may leave empty, and a DNS subdomain), empty for a
	// stage record.
	// +optional
	// +kubebuilder:validation:MaxLength=317
	// +kubebuilder:validation:Pattern=`^(([a-z0-9]([-a-z0-9]*[a-z0-9])?)?/[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*)?$`
	Pod string `json:"pod,omitempty"`

	// PodUID held the entry: letters, digits and dashes, as in an
	// Attachment entry.
	// +optional
	// +kubebuilder:validation:MaxLength=128
	// +kubebuilder:validation:Pattern=`^[0-9A-Za-z-]*$`
	PodUID string `json:"podUID,omitempty"`

	// Reason the entry went stale.
	Reason CleanupReason `json:"reason"`

	// FoundAt is when the entry was moved here.
	FoundAt metav1.Time `json:"foundAt"`
}

// IsStage tells whether the entry is a stage record rather than a pod mount.
func (s *StaleAttachment) IsStage() bool { return s.Pod == "" && s.PodUID == "" }

// UndoPath is the path undoing the entry takes away: a pod's mount dir, or
// a stage record's staging path (its mount dir when it names none).
func (s *StaleAttachment) UndoPath() string {
	if s.IsStage() && s.StagingPath != "" {
		return s.StagingPath
	}
	return s.MountDir
}

// NodeCleanupStatus is what the node's agent reports.
type NodeCleanupStatus struct {
	// LastProcessed is when the agent last worked through the list.
	// +optional
	LastProcessed *metav1.Time `json:"lastProcessed,omitempty"`

	// Pending counts entries not undone yet.
	// +optional
	Pending int32 `json:"pending,omitempty"`

	// Conditions tell whether the last pass succeeded.
	// +listType=map
	// +listMapKey=type
	// +optional
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// NodeCleanup is the stale-attachment list of one node, named after the node.
// The attachment GC and lock breaking add entries; the node's agent undoes
// them when it (re)starts and periodically.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:storageversion
// +kubebuilder:resource:scope=Cluster,shortName=bnc,categories=berth
// +kubebuilder:printcolumn:name="Entries",type=integer,JSONPath=`.status.pending`
// +kubebuilder:printcolumn:name="Volumes",type=string,JSONPath=`.spec.entries[*].volume`
// +kubebuilder:printcolumn:name="Blocklisted",type=string,JSONPath=`.spec.blocklisted[*].address`,priority=1
// +kubebuilder:printcolumn:name="Last-Processed",type=date,JSONPath=`.status.lastProcessed`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type NodeCleanup struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// +optional
	Spec NodeCleanupSpec `json:"spec,omitempty"`
	// +optional
	Status NodeCleanupStatus `json:"status,omitempty"`
}

// NodeCleanupList is a list of NodeCleanups.
// +kubebuilder:object:root=true
type NodeCleanupList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []NodeCleanup `json:"items"`
}

func init() {
	SchemeBuilder.Register(&NodeCleanup{}, &NodeCleanupList{})
}
