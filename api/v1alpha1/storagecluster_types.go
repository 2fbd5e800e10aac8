package v1alpha1

import (
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Backend names where a cluster's volumes live.
// +kubebuilder:validation:Enum=local;ceph
type Backend string

const (
	// BackendLocal keeps each volume as a sparse image file on its node.
	BackendLocal Backend = "local"
	// BackendCeph keeps volumes as RBD images in a Ceph pool.
	BackendCeph Backend = "ceph"
)

// NetworkProvider selects how storage traffic reaches the nodes.
// +kubebuilder:validation:Enum=host;multus
type NetworkProvider string

const (
	// NetworkProviderHost uses the host network.
	NetworkProviderHost NetworkProvider = "host"
	// NetworkProviderMultus attaches dedicated interfaces through multus
	// NetworkAttachmentDefinitions, kept alive by the holder/mover.
	NetworkProviderMultus NetworkProvider = "multus"
)

// CleanupPolicy says what deleting a StorageCluster does to its volumes.
// +kubebuilder:validation:Enum=Detach;Retain
type CleanupPolicy string

const (
	// CleanupDetach makes every agent unmount and detach the cluster's volumes
	// on its node, even while pods use them, before the cluster goes away.
	CleanupDetach CleanupPolicy = "Detach"
	// CleanupRetain leaves mounts and devices in place.
	CleanupRetain CleanupPolicy = "Retain"
)

// StorageClusterSpec is the wanted state of one storage cluster.
// +kubebuilder:validation:XValidation:rule="(has(self.backend) ? self.backend : 'local') != 'ceph' || has(self.ceph)",message="spec.ceph is required when backend is ceph"
// +kubebuilder:validation:XValidation:rule="!has(self.ceph) || (has(self.backend) ? self.backend : 'local') == 'ceph'",message="spec.ceph is only allowed when backend is ceph"
// +kubebuilder:validation:XValidation:rule="!has(self.overcommit) || (has(self.backend) ? self.backend : 'local') == 'local'",message="spec.overcommit is only allowed when backend is local"
// +kubebuilder:validation:XValidation:rule="self.network.provider != 'multus' || (has(self.network.selectors) && (has(self.network.selectors.public) || has(self.network.selectors.cluster)))",message="network.provider multus needs at least one of network.selectors.public or network.selectors.cluster"
type StorageClusterSpec struct {
	// Backend stores the volumes.
	// +kubebuilder:default=local
	// +optional
	Backend Backend `json:"backend,omitempty"`

	// Ceph names the existing Ceph cluster, pool and cephx client that hold
	// the volumes; required when backend is ceph, refused otherwise.
	// +optional
	Ceph *CephSpec `json:"ceph,omitempty"`

	// DataDir is the folder on each node that holds local volume images: a
	// clean absolute path, not / nor a system folder (ValidateDataDir).
	// +kubebuilder:default="/var/lib/berth"
	// +kubebuilder:validation:MaxLength=4096
	// +kubebuilder:validation:XValidation:rule="self.matches('^(/[^/]+)+$') && !self.matches('(^|/)[.][.]?(/|$)')",message="dataDir must be a clean absolute path (no '.', '..', '//' or trailing '/') and not /"
	// +kubebuilder:validation:XValidation:rule="!['/var','/var/lib','/home','/tmp','/opt','/srv','/mnt','/media'].exists(p, self == p) && !['/etc','/usr','/bin','/sbin','/lib','/lib32','/lib64','/libx32','/boot','/dev','/proc','/sys','/run','/var/run','/root','/var/lib/kubelet','/var/lib/containerd','/var/lib/docker','/var/log'].exists(p, self == p || self.startsWith(p + '/'))",message="dataDir must not be a system folder or lie under one (/etc, /usr, /bin, /sbin, /lib*, /boot, /dev, /proc, /sys, /run, /var/run, /root, /var/lib/kubelet, ...)"
	// +optional
	DataDir string `json:"dataDir,omitempty"`

	// Overcommit lets local volumes promise more space than their data dir
	// has (thin provisioning). Unset: each local image's full size is
	// reserved (fallocate) when it is made or grown, and capacity is what
	// is left after those reservations, so one volume filling never runs
	// its neighbours out of space. Refused for the ceph backend.
	// +optional
	Overcommit *OvercommitSpec `json:"overcommit,omitempty"`

	// Agent places the node agent.
	// +optional
	Agent AgentSpec `json:"agent,omitempty"`

	// CSIController sets the CSI controller Deployment, which serves every
	// StorageCluster: it runs the largest replicas any cluster asks, with
	// leader election unless every cluster turns it off.
	// +optional
	CSIController CSIControllerSpec `json:"csiController,omitempty"`

	// Network selects the networks storage traffic uses.
	// +kubebuilder:default={provider: host}
	// +optional
	Network NetworkSpec `json:"network,omitempty"`

	// AttachmentGC sets how often stale attachments are collected.
	// +kubebuilder:default={interval: "24h"}
	// +optional
	AttachmentGC AttachmentGCSpec `json:"attachmentGC,omitempty"`

	// RWX sets how read-write-many volumes are shared.
	// +kubebuilder:default={fastFailover: true, nfsGraceSeconds: 15, leaseDurationSeconds: 10}
	// +optional
	RWX RWXSpec `json:"rwx,omitempty"`

	// CleanupPolicy says what deleting this cluster does to its volumes on the nodes.
	// +kubebuilder:default=Detach
	// +optional
	CleanupPolicy CleanupPolicy `json:"cleanupPolicy,omitempty"`

	// CleanupTimeout bounds how long deletion (policy Detach) waits for the
	// agents of the nodes that hold this cluster's volumes (default 5m).
	// After it, those nodes' entries move to their stale lists, which each
	// agent works off when it is back, and the cluster goes: a node whose
	// agent is down never holds a deletion up.
	// +optional
	CleanupTimeout *metav1.Duration `json:"cleanupTimeout,omitempty"`
}

// OvercommitSpec is how far a node's local volumes may promise more space
// than their data dir's filesystem gives them.
type OvercommitSpec struct {
	// Percent of the space the data dir's filesystem gives local volumes
	// (what is free plus what their images take) that they may promise in
	// all: 300 promises three times that space, 100 exactly that space.
	// Images are sparse; when they fill past the real space, writes to
	// every volume of the data dir fail (ENOSPC) until space is freed.
	// +kubebuilder:validation:Minimum=100
	// +kubebuilder:validation:Maximum=10000
	Percent int32 `json:"percent"`
}

// AgentSpec places the node agent DaemonSet.
type AgentSpec struct {
	// NodeSelector limits the agent to matching nodes.
	// +optional
	NodeSelector map[string]string `json:"nodeSelector,omitempty"`

	// Tolerations let the agent run on tainted nodes.
	// +optional
	Tolerations []corev1.Toleration `json:"tolerations,omitempty"`

	// UserspaceTransport is how the agents serve volumes with mounter
	// userspace that they stage from now on: auto (ublk where the node's
	// kernel has it with user recovery, else fuse), fuse, nbd (nodes need
	// the nbd module) or ublk (nodes need Linux 6.0 or later with
	// CONFIG_BLK_DEV_UBLK and its user recovery; a stage on a node without
	// them is refused, naming what is missing). Staged volumes keep the
	// transport they have. Empty leaves it to each agent's
	// --userspace-transport, auto unless set. It is not defaulted in the
	// object: an agent of an earlier release, after a rollback, reads
	// empty as its own default (fuse), where it refuses auto.
	// +optional
	UserspaceTransport UserspaceTransport `json:"userspaceTransport,omitempty"`

	// Resources of the agent container, which also runs the blockdev server
	// of every userspace volume on the node and the mkfs, fsck and resize
	// tools (see AgentResources). Changing them rolls the agent on every
	// node: its userspace volumes are healed, kernel ones do not notice.
	// +optional
	Resources *AgentResources `json:"resources,omitempty"`

	// Flexvolume sets the agent's Flexvolume driver.
	// +optional
	Flexvolume FlexvolumeSpec `json:"flexvolume,omitempty"`
}

// FlexvolumeSpec sets the agent's Flexvolume driver, which the agent
// installs into kubelet's Flexvolume plugin folder on each node (the
// chart value volumePluginDir).
type FlexvolumeSpec struct {
	// Enabled (default true) mounts kubelet's plugin folder into the agent,
	// which installs the driver there. The agent serves every cluster: off
	// only when every cluster turns it off. Off, the agent installs no
	// driver and mounts no plugin folder; a driver installed before stays,
	// and the agent still answers it, so that pods mounted through it can
	// unmount.
	// +optional
	Enabled *bool `json:"enabled,omitempty"`
}

// FlexvolumeEnabled tells whether the cluster wants the Flexvolume driver
// (Enabled, true when unset).
func (a AgentSpec) FlexvolumeEnabled() bool {
	return a.Flexvolume.Enabled == nil || *a.Flexvolume.Enabled
}

// AgentResources are the agent container's CPU and memory requests and
// limits. The blockdev servers take about 15 MiB of memory and 30 threads
// per Ceph volume (librbd), 2 MiB and 16 threads per local one, idle; size
// limits.memory, with room for fsck on the largest file system, for the
// userspace volumes a node may hold, and the node's pod pids limit for
// their threads. Reaching the memory limit kills every server of the node
// at once where the kubelet kills the whole container (cgroup v2): their
// volumes' I/O waits until the healer has started them again.
//
// Unset (or empty): requests cpu 100m and memory 128Mi, limits memory 2Gi,
// and no CPU limit, which would throttle every userspace volume's I/O on
// the node at once. Set, it replaces those whole; a limit without a
// request requests the limit, as for a pod, and a zero amount is none. The
// API server refuses a negative amount (one stored before that rule counts
// as none). The agent serves every StorageCluster: it gets, per resource,
// the largest request any served cluster asks and the largest limit (none
// if any sets none), never below the request; a deleted cluster whose
// Volumes remain asks the defaults until they are gone.
type AgentResources struct {
	// Requests are the CPU and memory the scheduler keeps for the agent;
	// the CPU request is its weight against the workloads when the node
	// is busy.
	// +kubebuilder:validation:XValidation:rule="self.all(k, k == 'cpu' || k == 'memory')",message="only cpu and memory"
	// +kubebuilder:validation:XValidation:rule="!has(self.cpu) || (type(self.cpu) == string ? !self.cpu.startsWith('-') : self.cpu >= 0)",message="cpu must not be negative"
	// +kubebuilder:validation:XValidation:rule="!has(self.memory) || (type(self.memory) == string ? !self.memory.startsWith('-') : self.memory >= 0)",message="memory must not be negative"
	// +optional
	Requests corev1.ResourceList `json:"requests,omitempty"`

	// Limits cap the agent's CPU and memory.
	// +kubebuilder:validation:XValidation:rule="self.all(k, k == 'cpu' || k == 'memory')",message="only cpu and memory"
	// +kubebuilder:validation:XValidation:rule="!has(self.cpu) || (type(self.cpu) == string ? !self.cpu.startsWith('-') : self.cpu >= 0)",message="cpu must not be negative"
	// +kubebuilder:validation:XValidation:rule="!has(self.memory) || (type(self.memory) == string ? !self.memory.startsWith('-') : self.memory >= 0)",message="memory must not be negative"
	// +optional
	Limits corev1.ResourceList `json:"limits,omitempty"`
}

// CSIControllerSpec sets the CSI controller Deployment: berth's CSI
// controller and the provisioner, resizer and snapshotter sidecars.
// +kubebuilder:validation:XValidation:rule="!has(self.replicas) || self.replicas <= 1 || !has(self.leaderElection) || self.leaderElection",message="csiController.replicas above 1 need leaderElection"
type CSIControllerSpec struct {
	// Replicas of the CSI controller pod (default 1). With more than one,
	// the sidecars elect a leader, which alone serves, and a
	// PodDisruptionBudget lets drains stop one pod at a time.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=5
	// +optional
	Replicas *int32 `json:"replicas,omitempty"`

	// LeaderElection of the sidecars and of berth's own pool capacity
	// publisher (default true): each takes a Lease in berth's namespace
	// before it acts. Off saves the Lease traffic and the wait for a Lease
	// after a restart, with one replica only.
	// +optional
	LeaderElection *bool `json:"leaderElection,omitempty"`

	// Resources of berth's CSI controller container: CPU and memory
	// requests and limits, no claims. Unset (or empty): requests cpu 10m
	// and memory 32Mi, limits cpu 500m and memory 256Mi. Set, it replaces
	// those whole; a limit without a request requests the limit, as for a
	// pod, and a zero amount is none. The provisioner, resizer and
	// snapshotter sidecars keep those defaults whatever is set here. The
	// CSI controller serves every StorageCluster: it gets, per resource, the
	// largest request any cluster asks and the largest limit (none if any
	// sets none), never below the request.
	// +kubebuilder:validation:XValidation:rule="!has(self.claims) || size(self.claims) == 0",message="claims are not supported"
	// +kubebuilder:validation:XValidation:rule="!has(self.requests) || self.requests.all(k, k == 'cpu' || k == 'memory')",message="only cpu and memory"
	// +kubebuilder:validation:XValidation:rule="!has(self.limits) || self.limits.all(k, k == 'cpu' || k == 'memory')",message="only cpu and memory"
	// +kubebuilder:validation:XValidation:rule="!has(self.requests) || self.requests.all(k, type(self.requests[k]) == string ? !self.requests[k].startsWith('-') : self.requests[k] >= 0)",message="requests must not be negative"
	// +kubebuilder:validation:XValidation:rule="!has(self.limits) || self.limits.all(k, type(self.limits[k]) == string ? !self.limits[k].startsWith('-') : self.limits[k] >= 0)",message="limits must not be negative"
	// +optional
	Resources *corev1.ResourceRequirements `json:"resources,omitempty"`
}

// MultusMode is how host-network processes (the agents) use the public
// network that the holder pods keep.
// +kubebuilder:validation:Enum=netns;mover
type MultusMode string

const (
	// MultusModeNetns: the agent runs its storage network operations inside
	// the holder's network namespace; no interface moves (the default).
	MultusModeNetns MultusMode = "netns"
	// MultusModeMover: a privileged mover DaemonSet disables each holder's
	// interface and copies it into the host network namespace.
	MultusModeMover MultusMode = "mover"
)

// NetworkSpec selects the networks storage traffic uses.
// +kubebuilder:validation:XValidation:rule="!has(self.selectors) || self.provider == 'multus'",message="network.selectors is only allowed with provider multus"
// +kubebuilder:validation:XValidation:rule="!has(self.multus) || self.provider == 'multus'",message="network.multus is only allowed with provider multus"
type NetworkSpec struct {
	// Provider is host (default) or multus.
	// +kubebuilder:default=host
	// +optional
	Provider NetworkProvider `json:"provider,omitempty"`

	// Selectors name the multus NetworkAttachmentDefinitions ("namespace/name").
	// +optional
	Selectors *NetworkSelectors `json:"selectors,omitempty"`

	// Multus sets how the holder pods keep the public network; only with
	// provider multus. Unset: the netns mode, the holder runs berth's image.
	// +optional
	Multus *MultusSpec `json:"multus,omitempty"`
}

// MultusSpec sets the holder and how the agents use its interface.
type MultusSpec struct {
	// Mode is netns (default: the agents work inside the holders' network
	// namespaces) or mover (a privileged DaemonSet copies each holder's
	// interface into the host network namespace; off unless chosen). A
	// change reaches a node when its holder pods are deleted (OnDelete).
	// +kubebuilder:default=netns
	// +optional
	Mode MultusMode `json:"mode,omitempty"`

	// HolderImage overrides the holder pods' image (default: the operator's
	// berth image). It must provide `berth holder`.
	// +kubebuilder:validation:MaxLength=1024
	// +optional
	HolderImage string `json:"holderImage,omitempty"`
}

// MultusMode returns the mode in effect: Multus.Mode, netns when unset.
func (n NetworkSpec) MultusMode() MultusMode {
	if n.Multus == nil || n.Multus.Mode == "" {
		return MultusModeNetns
	}
	return n.Multus.Mode
}

// NetworkSelectors name the multus networks for client and replication traffic.
type NetworkSelectors struct {
	// Public carries client traffic: the agents to the Ceph daemons, NFS
	// between workloads and share managers. A NetworkAttachmentDefinition,
	// "namespace/name".
	// +kubebuilder:validation:MaxLength=317
	// +kubebuilder:validation:XValidation:rule="self.matches('^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?/[a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*$') && self.size() - self.indexOf('/') - 1 <= 253",message="must be the namespace/name of a NetworkAttachmentDefinition"
	// +optional
	Public string `json:"public,omitempty"`

	// Cluster carries replication traffic between backend daemons that use
	// one; it defaults to Public. A NetworkAttachmentDefinition,
	// "namespace/name".
	// +kubebuilder:validation:MaxLength=317
	// +kubebuilder:validation:XValidation:rule="self.matches('^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?/[a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*$') && self.size() - self.indexOf('/') - 1 <= 253",message="must be the namespace/name of a NetworkAttachmentDefinition"
	// +optional
	Cluster string `json:"cluster,omitempty"`
}

// ClusterNetwork returns the network replication traffic uses: Cluster when
// set, else Public.
func (s *NetworkSelectors) ClusterNetwork() string {
	if s == nil {
		return ""
	}
	if s.Cluster != "" {
		return s.Cluster
	}
	return s.Public
}

// AttachmentGCSpec sets the stale-attachment collector.
type AttachmentGCSpec struct {
	// Interval between two scans of all Attachments.
	// +kubebuilder:default="24h"
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:XValidation:rule="duration(self) >= duration('1s')",message="attachmentGC.interval must be at least 1s"
	// +optional
	Interval *metav1.Duration `json:"interval,omitempty"`
}

// RWXSpec sets how read-write-many volumes are shared over NFS. Users set
// nothing for an RWX claim: these are cluster-wide knobs with safe defaults.
type RWXSpec struct {
	// FastFailover (on by default) moves a share as soon as its share
	// manager's Lease lapses or its pod fails: the old pod is force-deleted,
	// a new one starts (away from the failed node when the backend allows
	// it) and workloads are asked to remount. Off: a failed pod is deleted
	// gracefully and replaced once gone, and the Lease is not watched.
	// +kubebuilder:default=true
	// +optional
	FastFailover *bool `json:"fastFailover,omitempty"`

	// LeaseDurationSeconds is how long a share manager's Lease holds without
	// renewal before the share fails over.
	// +kubebuilder:default=10
	// +kubebuilder:validation:Minimum=3
	// +kubebuilder:validation:Maximum=300
	// +optional
	LeaseDurationSeconds *int32 `json:"leaseDurationSeconds,omitempty"`

	// NFSGraceSeconds is the NFS grace period after a share moves. It is
	// at least the NFS lease (15 s), and a smaller value is raised to it: a
	// client that learns of the move only at its next renewal must still
	// reclaim its open files.
	// +kubebuilder:default=15
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=180
	// +optional
	NFSGraceSeconds *int32 `json:"nfsGraceSeconds,omitempty"`

	// ClientCIDRs are admitted by every share of this cluster besides the
	// addresses of its workload nodes (their InternalIPs, the gateway
	// addresses of their pod CIDRs, their multus holders). Set them where
	// a node's traffic to a Service leaves with another address, e.g.
	// kube-proxy masquerading it to a CNI gateway or tunnel address of a
	// node without spec.podCIDR. Every host in them is admitted, pods
	// included. A share manager reads them when it starts.
	// +kubebuilder:validation:MaxItems=64
	// +listType=set
	// +optional
	ClientCIDRs []string `json:"clientCIDRs,omitempty"`

	// ShareManagerResources are the share-manager pods' resource requests
	// and limits, as a whole. Unset: requests 100m CPU and 128Mi memory,
	// limits 1 CPU and 1Gi memory (ganesha's caches grow with the files
	// its clients open). With requests a share manager is not among the
	// first pods a node under pressure evicts; with limits a runaway
	// ganesha is held to its own volume's share.
	// +optional
	ShareManagerResources *corev1.ResourceRequirements `json:"shareManagerResources,omitempty"`
}

// StorageClusterPhase summarises a cluster's state.
// +kubebuilder:validation:Enum=Progressing;Ready;Deleting;Error
type StorageClusterPhase string

// StorageCluster phases.
const (
	StorageClusterProgressing StorageClusterPhase = "Progressing"
	StorageClusterReady       StorageClusterPhase = "Ready"
	StorageClusterDeleting    StorageClusterPhase = "Deleting"
	StorageClusterError       StorageClusterPhase = "Error"
)

// StorageClusterStatus is the observed state of a storage cluster.
type StorageClusterStatus struct {
	// Phase summarises the conditions.
	// +optional
	Phase StorageClusterPhase `json:"phase,omitempty"`

	// ObservedGeneration is the spec generation the status describes.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`

	// CleanedNodes lists the nodes whose agents finished cleanup during deletion.
	// +listType=set
	// +optional
	CleanedNodes []string `json:"cleanedNodes,omitempty"`

	// Conditions tell what is ready and what is not.
	// +listType=map
	// +listMapKey=type
	// +optional
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// StorageCluster is one storage cluster: its backend, where its agents run,
// its networks, and how its volumes are collected and cleaned up.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:storageversion
// +kubebuilder:resource:scope=Cluster,shortName=bsc,categories=berth
// +kubebuilder:printcolumn:name="Backend",type=string,JSONPath=`.spec.backend`
// +kubebuilder:printcolumn:name="Network",type=string,JSONPath=`.spec.network.provider`
// +kubebuilder:printcolumn:name="Phase",type=string,JSONPath=`.status.phase`
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type StorageCluster struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// +optional
	Spec StorageClusterSpec `json:"spec,omitempty"`
	// +optional
	Status StorageClusterStatus `json:"status,omitempty"`
}

// StorageClusterList is a list of StorageClusters.
// +kubebuilder:object:root=true
type StorageClusterList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []StorageCluster `json:"items"`
}

func init() {
	SchemeBuilder.Register(&StorageCluster{}, &StorageClusterList{})
}
