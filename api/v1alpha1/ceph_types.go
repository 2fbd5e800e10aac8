package v1alpha1

// CephSpec names where a ceph-backed cluster keeps its volumes: RBD images
// in a pool of an existing Ceph cluster (deployed by Rook, cephadm or by
// hand; berth runs no Ceph daemon).
// +kubebuilder:validation:XValidation:rule="self.pool == oldSelf.pool",message="ceph.pool cannot be changed: the cluster's volumes live in it"
// +kubebuilder:validation:XValidation:rule="!has(oldSelf.nodeSecretRef) || (has(self.nodeSecretRef) && self.nodeSecretRef == oldSelf.nodeSecretRef)",message="ceph.nodeSecretRef may be added but not changed or removed: the volumes made since name it"
// +kubebuilder:validation:XValidation:rule="!has(self.imageFeatures) || ('layering' in self.imageFeatures && 'exclusive-lock' in self.imageFeatures)",message="ceph.imageFeatures must include layering (snapshots, clones) and exclusive-lock (one writer at a time)"
// +kubebuilder:validation:XValidation:rule="!has(self.imageFeatures) || !('fast-diff' in self.imageFeatures) || 'object-map' in self.imageFeatures",message="ceph.imageFeatures: fast-diff needs object-map"
type CephSpec struct {
	// Monitors are the Ceph monitors' addresses, HOST:PORT each (an IPv6
	// address in brackets). Port 6789 is spoken with the legacy protocol
	// (msgr1), any other port with msgr2; a v1: or v2: prefix says which
	// explicitly.
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=16
	// +listType=set
	Monitors []CephMonitor `json:"monitors"`

	// Pool holds the RBD images and berth's name maps. Fixed once set.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=127
	// +kubebuilder:validation:Pattern=`^[A-Za-z0-9][A-Za-z0-9._-]*$`
	Pool string `json:"pool"`

	// DataPool, when set, holds the images' data (an erasure-coded pool,
	// say) while their metadata stays in Pool.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=127
	// +kubebuilder:validation:Pattern=`^[A-Za-z0-9][A-Za-z0-9._-]*$`
	// +optional
	DataPool string `json:"dataPool,omitempty"`

	// SecretRef names the Secret with the cephx client the operator and
	// the CSI controller connect as: key userID (the client's id without
	// "client.") and key userKey (its secret). The client needs `profile
	// rbd` on Pool (and DataPool), and mon `allow command "osd blocklist"`
	// so that a fenced node's client can be taken off the blocklist again.
	// The key is never logged nor shown in status or Events. The Secret
	// must be in berth's namespace: berth may read Secrets there only.
	SecretRef CephSecretReference `json:"secretRef"`

	// NodeSecretRef names the Secret (same keys, berth's namespace) with
	// the cephx client the nodes stage volumes as: kubelet hands it to
	// every node as the node-stage secret. It needs `profile rbd` on mon,
	// and on Pool (and DataPool) for osd, and nothing more: nodes fence no
	// client (the operator does, with SecretRef's), and `profile rbd`
	// cannot take one off the blocklist. Unset, the nodes get SecretRef's
	// client, and any node could lift any fence. It may be added to a cluster made without
	// it: the operator then makes the cluster's StorageClasses anew with
	// it, and the volumes made before keep staging with SecretRef's client
	// (their PersistentVolumes name it). It may not be changed or removed.
	// +optional
	NodeSecretRef *CephSecretReference `json:"nodeSecretRef,omitempty"`

	// ImageFeatures of the images berth makes (default layering,
	// exclusive-lock, which are also the least allowed).
	// +kubebuilder:default={layering,exclusive-lock}
	// +kubebuilder:validation:MaxItems=6
	// +listType=set
	// +optional
	ImageFeatures []CephImageFeature `json:"imageFeatures,omitempty"`
}

// CephMonitor is one monitor address: [v1:|v2:]HOST:PORT.
// +kubebuilder:validation:MaxLength=262
// +kubebuilder:validation:Pattern=`^(v[12]:)?(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9]([-A-Za-z0-9.]*[A-Za-z0-9])?):([1-9][0-9]{0,3}|[1-5][0-9]{4}|6[0-4][0-9]{3}|65[0-4][0-9]{2}|655[0-2][0-9]|6553[0-5])$`
type CephMonitor string

// CephImageFeature is an RBD image feature berth may enable, by rbd's name.
// +kubebuilder:validation:Enum=layering;exclusive-lock;object-map;fast-diff;deep-flatten;journaling
type CephImageFeature string

// CephSecretReference names a Secret in a namespace.
type CephSecretReference struct {
	// Name of the Secret.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	Name string `json:"name"`
	// Namespace of the Secret.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	Namespace string `json:"namespace"`
}

// Keys of the Secret that CephSpec.SecretRef names (Ceph-CSI's names).
const (
	CephSecretUserID  = "userID"
	CephSecretUserKey = "userKey"
)

// NodeStageSecret is the Secret the nodes stage with: NodeSecretRef, else
// SecretRef.
func (c *CephSpec) NodeStageSecret() CephSecretReference {
	if c.NodeSecretRef != nil {
		return *c.NodeSecretRef
	}
	return c.SecretRef
}
