package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// AttachmentSpec records who holds a volume. Fencing rides on the API
// server's optimistic concurrency: whoever writes an entry first holds it.
type AttachmentSpec struct {
	// AccessMode is the mode the holders were granted under.
	AccessMode AccessMode `json:"accessMode"`

	// Attachments are the holders: one record per node that staged the volume
	// (Pod empty, MountDir the staging path) and one per pod mount.
	// +listType=map
	// +listMapKey=node
	// +listMapKey=mountDir
	// +kubebuilder:validation:MaxItems=1024
	// +optional
	Attachments []AttachmentEntry `json:"attachments,omitempty"`

	// Holders summarizes Attachments for `kubectl get` ("node" for a stage
	// record, "node/namespace/pod" for a pod), written with every change of
	// Attachments: a printer column shows only the first match of a list.
	// +optional
	Holders string `json:"holders,omitempty"`

	// TakeOvers are requests to take the volume over from holders that
	// only lock breaking removes (a node gone or out of service, a pod
	// that moved): an agent adds its own node's request and waits; the
	// operator checks the lock-breaking rules against the Node and Pod
	// objects and, where they allow it, fences and removes the holds. No
	// agent removes another node's holds itself (F4).
	// +listType=map
	// +listMapKey=node
	// +listMapKey=mountDir
	// +kubebuilder:validation:MaxItems=64
	// +optional
	TakeOvers []TakeOverRequest `json:"takeOvers,omitempty"`
}

// TakeOverRequest is a hold a node's agent asks for while others hold the
// volume in a way the access mode excludes.
type TakeOverRequest struct {
	AttachmentEntry `json:",inline"`

	// AccessMode is the mode the hold is requested under.
	AccessMode AccessMode `json:"accessMode"`

	// SoleDevice marks the share manager's request for the device of a
	// shared volume: only other nodes' device holds block it.
	// +optional
	SoleDevice bool `json:"soleDevice,omitempty"`

	// RequestedAt is when the agent asked; the operator drops a request
	// nobody renewed for ten minutes.
	RequestedAt metav1.Time `json:"requestedAt"`
}

// AttachmentEntry is one holder of a volume.
type AttachmentEntry struct {
	// Node is the node the volume is attached to: a node name (a DNS
	// subdomain).
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`
	Node string `json:"node"`

	// PodNamespace is the namespace of the pod (a DNS label), empty for a
	// node's stage record. The pod fields are checked because the
	// attachment GC looks the pod up: a name no pod can have failed it.
	// +optional
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^([a-z0-9]([-a-z0-9]*[a-z0-9])?)?$`
	PodNamespace string `json:"podNamespace,omitempty"`

	// Pod is the name of the pod (a DNS subdomain), empty for a node's
	// stage record.
	// +optional
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*)?$`
	Pod string `json:"pod,omitempty"`

	// PodUID is the UID of the pod, empty for a node's stage record:
	// letters, digits and dashes, as in a UUID or the hash kubelet gives a
	// static pod (Kubernetes sets no stricter rule, and a static pod's
	// manifest may choose its own).
	// +optional
	// +kubebuilder:validation:MaxLength=128
	// +kubebuilder:validation:Pattern=`^[0-9A-Za-z-]*$`
	PodUID string `json:"podUID,omitempty"`

	// MountDir is the pod's mount directory, or the staging path for a node's
	// stage record: absolute and clean (no ., .., // or trailing /), at most
	// 1024 bytes (room for kubelet's longest volume paths, and within the
	// API server's cost budget for the rule).
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=1024
	// +kubebuilder:validation:Pattern=`^(/[^/]+)+$`
	// +kubebuilder:validation:XValidation:rule="!(self + '/').contains('/./') && !(self + '/').contains('/../')",message="must be a clean absolute path: no . or .. components"
	MountDir string `json:"mountDir"`

	// StagingPath is the node-global path where the volume is staged.
	// +optional
	// +kubebuilder:validation:MaxLength=1024
	// +kubebuilder:validation:Pattern=`^(/[^/]+)+$`
	// +kubebuilder:validation:XValidation:rule="!(self + '/').contains('/./') && !(self + '/').contains('/../')",message="must be a clean absolute path: no . or .. components"
	StagingPath string `json:"stagingPath,omitempty"`

	// ReadOnly is true for read-only mounts.
	// +optional
	ReadOnly bool `json:"readOnly,omitempty"`
}

// IsStage tells whether the entry is a node's stage record rather than a pod mount.
func (e *AttachmentEntry) IsStage() bool { return e.Pod == "" && e.PodUID == "" }

// AttachmentNodeStatus is what the agent of one node reports.
type AttachmentNodeStatus struct {
	// Node the status is about.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	Node string `json:"node"`

	// DevicePath is the kernel block device the volume is attached as.
	// +kubebuilder:validation:MaxLength=64
	// +kubebuilder:validation:Pattern=`^/dev/[A-Za-z0-9._-]+$`
	// +optional
	DevicePath string `json:"devicePath,omitempty"`

	// Staged is true once the volume is staged on the node (mounted at its
	// staging path, or bound there as a block device).
	// +optional
	Staged bool `json:"staged,omitempty"`

	// StagingPath is where the volume is staged on the node.
	// +optional
	// +kubebuilder:validation:MaxLength=1024
	// +kubebuilder:validation:Pattern=`^(/[^/]+)+$`
	// +kubebuilder:validation:XValidation:rule="!(self + '/').contains('/./') && !(self + '/').contains('/../')",message="must be a clean absolute path: no . or .. components"
	StagingPath string `json:"stagingPath,omitempty"`

	// CephClients are the Ceph client addresses (librados instance
	// addresses, "IP:PORT/NONCE") of the server(s) that serve the volume on
	// the node: a Ceph volume's lock breaking blocklists them before
	// another node may map it. Empty for other backends.
	// +listType=set
	// +kubebuilder:validation:MaxItems=16
	// +kubebuilder:validation:items:MaxLength=128
	// +kubebuilder:validation:items:Pattern=`^[^\s,]+$`
	// +optional
	CephClients []string `json:"cephClients,omitempty"`
}

// AttachmentStatus is the observed state of an attachment.
type AttachmentStatus struct {
	// Nodes holds per-node state: each node's agent writes its own entry
	// after a stage and removes it at unstage.
	// +listType=map
	// +listMapKey=node
	// +kubebuilder:validation:MaxItems=1024
	// +optional
	Nodes []AttachmentNodeStatus `json:"nodes,omitempty"`

	// Devices summarizes Nodes for `kubectl get -o wide`: "node=device"
	// for each staged node, in node order.
	// +optional
	Devices string `json:"devices,omitempty"`
}

// Attachment fences one volume: it is named after the volume (PV), so a
// lookup is one GET, and lists every node and pod that holds it.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:storageversion
// +kubebuilder:resource:scope=Cluster,shortName=batt,categories=berth
// +kubebuilder:printcolumn:name="Mode",type=string,JSONPath=`.spec.accessMode`
// +kubebuilder:printcolumn:name="Holders",type=string,JSONPath=`.spec.holders`
// +kubebuilder:printcolumn:name="Devices",type=string,JSONPath=`.status.devices`,priority=1
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type Attachment struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec AttachmentSpec `json:"spec"`
	// +optional
	Status AttachmentStatus `json:"status,omitempty"`
}

// AttachmentList is a list of Attachments.
// +kubebuilder:object:root=true
type AttachmentList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []Attachment `json:"items"`
}

func init() {
	SchemeBuilder.Register(&Attachment{}, &AttachmentList{})
}
