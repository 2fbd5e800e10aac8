package agent

import "errors"

// Errors callers decide on; the CSI and agent-socket boundaries map them to
// their own codes.
var (
	// ErrBusy: another operation on the volume is running.
	ErrBusy = errors.New("another operation on this volume is in progress")
	// ErrVolumeNotFound: no Volume object (or image) of that ID.
	ErrVolumeNotFound = errors.New("volume not found")
	// ErrWrongNode: the volume lives on another node.
	ErrWrongNode = errors.New("volume belongs to another node")
	// ErrNotStaged: publish before stage.
	ErrNotStaged = errors.New("volume is not staged on this node")
	// ErrUnsupported: the volume asks for something this agent cannot do.
	ErrUnsupported = errors.New("not supported")
	// ErrClusterDeleting: the volume's StorageCluster is being deleted, so
	// nothing of it may be staged any more.
	ErrClusterDeleting = errors.New("storage cluster is being deleted")
	// ErrNotOwned: a Flexvolume pod names a Volume its namespace does not own.
	ErrNotOwned = errors.New("volume not owned by the pod's namespace")
	// ErrInvalid: a path outside the node's volume folders, or a volume
	// name that breaks the volume name rule.
	ErrInvalid = errors.New("invalid argument")
	// ErrIdentity: a Flexvolume call's options disagree with the pod that
	// kubelet's mount dir names.
	ErrIdentity = errors.New("pod identity refused")
)
