package v1alpha1

import (
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// KeepRunningAnnotation set to "true" on a ShareManager keeps its share
// running while no workload uses the volume: for an operator who probes the
// share (`berth share probe`), or warms it up before the workloads come.
const KeepRunningAnnotation = "berth.io/keep-running"

// ShareSizeAnnotation on a share manager's Lease is the size, in bytes, of
// the volume its filesystem fills (grown to the device's size after an
// expansion); the controller mirrors it into ShareManagerStatus.Size.
const ShareSizeAnnotation = "berth.io/share-size"

// ShareClientsAnnotation on a share manager's Lease names, comma-separated,
// the nodes whose addresses its ganesha admits now (the clients it has
// applied); the controller mirrors it into ShareManagerStatus.AdmittedNodes.
const ShareClientsAnnotation = "berth.io/share-clients"

// ShareManagerSpec is the wanted state of a read-write-many volume's share.
type ShareManagerSpec struct {
	// Volume is the name of the Volume this share serves.
	// +kubebuilder:validation:MinLength=1
	Volume string `json:"volume"`

	// Image runs the share-manager pod (berth share-manager with nfs-ganesha).
	// +kubebuilder:validation:MinLength=1
	Image string `json:"image"`

	// Clients are the nodes the share admits, with the addresses their
	// NFS mounts come from; every other address is refused. The operator
	// keeps them to the nodes that hold the volume for a workload pod (the
	// Attachment's entries), with addresses from their Node objects and,
	// on a multus network, their holder pods.
	// +listType=map
	// +listMapKey=node
	// +optional
	Clients []ShareClient `json:"clients,omitempty"`
}

// ShareClient is one node a share admits.
type ShareClient struct {
	// Node is the node's name.
	Node string `json:"node"`
	// Addresses are the IP addresses its NFS client may connect from.
	// +listType=set
	Addresses []string `json:"addresses"`
}

// ShareManagerStatus is the observed state of a share.
type ShareManagerStatus struct {
	// State of the share.
	// +kubebuilder:default=unknown
	// +optional
	State ShareState `json:"state,omitempty"`

	// OwnerID is the node whose share-manager serves the volume now.
	// +optional
	OwnerID string `json:"ownerID,omitempty"`

	// Endpoint is the NFS endpoint workloads mount,
	// nfs://<service>.<namespace>.svc/<volume>, set while the share runs.
	// +optional
	Endpoint string `json:"endpoint,omitempty"`

	// Size is the size of the volume the share serves, as its share manager
	// last reported it: after an expansion, the new size once the served
	// filesystem has grown.
	// +optional
	Size *resource.Quantity `json:"size,omitempty"`

	// AdmittedNodes are the nodes the running share manager admits, as it
	// last reported: those of spec.clients that its ganesha has applied.
	// +listType=set
	// +optional
	AdmittedNodes []string `json:"admittedNodes,omitempty"`

	// FailedNode is the node of the last share manager that failed or lost
	// its Lease; the next pod avoids it when the backend allows.
	// +optional
	FailedNode string `json:"failedNode,omitempty"`

	// Failovers counts the share managers replaced after a failure.
	// +optional
	Failovers int32 `json:"failovers,omitempty"`

	// Conditions tell what is ready and what is not (Ready: the share
	// serves, with the reason when it does not).
	// +listType=map
	// +listMapKey=type
	// +optional
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// ShareManager serves one read-write-many volume over NFS-Ganesha from one
// node at a time, and fails over to another node when its lease lapses. It
// is named after its Volume, lives in the operator's namespace and is owned
// by the Volume.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:storageversion
// +kubebuilder:resource:shortName=bsm,categories=berth
// +kubebuilder:printcolumn:name="State",type=string,JSONPath=`.status.state`
// +kubebuilder:printcolumn:name="Node",type=string,JSONPath=`.status.ownerID`
// +kubebuilder:printcolumn:name="Endpoint",type=string,JSONPath=`.status.endpoint`
// +kubebuilder:printcolumn:name="Size",type=string,JSONPath=`.status.size`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
// +kubebuilder:printcolumn:name="Volume",type=string,JSONPath=`.spec.volume`,priority=1
type ShareManager struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec ShareManagerSpec `json:"spec"`
	// +optional
	Status ShareManagerStatus `json:"status,omitempty"`
}

// ShareManagerList is a list of ShareManagers.
// +kubebuilder:object:root=true
type ShareManagerList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []ShareManager `json:"items"`
}

func init() {
	SchemeBuilder.Register(&ShareManager{}, &ShareManagerList{})
}
