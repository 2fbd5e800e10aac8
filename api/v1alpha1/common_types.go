package v1alpha1

// AccessMode is how a volume may be used at once, following Kubernetes'
// PersistentVolume access modes.
// +kubebuilder:validation:Enum=ReadWriteOncePod;ReadWriteOnce;ReadWriteMany;ReadOnlyMany
type AccessMode string

const (
	// ReadWriteOncePod allows a single pod.
	ReadWriteOncePod AccessMode = "ReadWriteOncePod"
	// ReadWriteOnce allows a single node, with any number of pods on it.
	ReadWriteOnce AccessMode = "ReadWriteOnce"
	// ReadWriteMany allows many nodes and pods, read-write.
	ReadWriteMany AccessMode = "ReadWriteMany"
	// ReadOnlyMany allows many nodes and pods, read-only.
	ReadOnlyMany AccessMode = "ReadOnlyMany"
)

// VolumeMode says whether a volume carries a filesystem or is a raw block device.
// +kubebuilder:validation:Enum=Filesystem;Block
type VolumeMode string

const (
	// VolumeModeFilesystem volumes are formatted and mounted.
	VolumeModeFilesystem VolumeMode = "Filesystem"
	// VolumeModeBlock volumes are handed to the pod as a device.
	VolumeModeBlock VolumeMode = "Block"
)

// Mounter says how a volume's backend image becomes a kernel block device.
// +kubebuilder:validation:Enum=kernel;userspace
type Mounter string

const (
	// MounterKernel attaches the image with a loop device directly.
	MounterKernel Mounter = "kernel"
	// MounterUserspace serves the image through berth blockdev (FUSE + loop,
	// nbd or ublk: see UserspaceTransport), whose kernel connection outlives
	// the server across restarts.
	MounterUserspace Mounter = "userspace"
)

// UserspaceTransport says how a node's userspace volumes reach the kernel.
// +kubebuilder:validation:Enum=auto;fuse;nbd;ublk
type UserspaceTransport string

const (
	// TransportAuto is ublk on a node whose kernel serves ublk with user
	// recovery, else fuse: decided at each stage, on the node, and kept
	// for the volume until it is unstaged.
	TransportAuto UserspaceTransport = "auto"
	// TransportFUSE serves a FUSE file, whose connection berth keeper holds,
	// with a loop device on it. Works on every kernel with FUSE.
	TransportFUSE UserspaceTransport = "fuse"
	// TransportNBD serves a kernel nbd device over socket pairs; the kernel
	// keeps the device and queues I/O while no server is connected (up to
	// the dead-connection timeout). Needs the nbd module on the node.
	TransportNBD UserspaceTransport = "nbd"
	// TransportUblk serves a kernel ublk device over io_uring. The kernel
	// keeps the device and queues its I/O while no server runs, and a new
	// server recovers it (user recovery). Needs Linux 6.0 or later with
	// CONFIG_BLK_DEV_UBLK (the ublk_drv module) and user recovery
	// (UBLK_F_USER_RECOVERY with _REISSUE). berth asks the driver for its
	// features, which drivers answer from Linux 6.5 on.
	TransportUblk UserspaceTransport = "ublk"
)

// Condition types shared by berth resources.
const (
	// ConditionReady is True when the object is fully usable.
	ConditionReady = "Ready"
)

// Names shared by the CSI controller, the agent and the operator.
const (
	// DriverName is berth's CSI driver name.
	DriverName = "berth.io"
	// TopologyNodeKey is the topology key of a local volume's node.
	TopologyNodeKey = "topology.berth.io/node"
	// NodeLabel on Volumes, Snapshots and CSIStorageCapacities names the
	// node whose agent owns them, so that each agent watches only its own.
	NodeLabel = "berth.io/node"
	// SharedLabel ("true") on a Volume marks it as served by a share manager
	// (read-write-many filesystem): its workloads mount it over NFS on any
	// node, so every agent watches these besides its own node's.
	SharedLabel = "berth.io/shared"
	// NamespaceLabel on a Volume names the namespace whose pods may mount it
	// through Flexvolume without a PersistentVolume.
	NamespaceLabel = "berth.io/namespace"
	// CSINameAnnotation keeps the name Kubernetes asked for, when the
	// object's name had to be derived from it.
	CSINameAnnotation = "berth.io/csi-name"
	// ParamStorageCluster is the StorageClass parameter naming the
	// StorageCluster a class's volumes belong to (the CSI controller serves
	// every cluster; the operator sets it on the classes it makes).
	ParamStorageCluster = "storageCluster"
	// ImageFinalizer keeps a Volume or Snapshot until its agent removed the image.
	ImageFinalizer = "berth.io/image"
)
