package agent

import (
	"github.com/berth-io/berth/internal/volerr"
)

// Errors callers decide on. Each is of one volerr kind, which is all the CSI
// and agent-socket boundaries look at (internal/agent/errcode). A bad path or
// volume name is volerr.ErrInvalid itself.
var (
	// ErrBusy: another operation on the volume is running.
	ErrBusy = volerr.New(volerr.ErrBusy, "another operation on this volume is in progress")
	// ErrVolumeNotFound: no Volume object (or image) of that ID.
	ErrVolumeNotFound = volerr.New(volerr.ErrNotFound, "volume not found")
	// ErrWrongNode: the volume lives on another node.
	ErrWrongNode = volerr.New(volerr.ErrWrongNode, "volume belongs to another node")
	// ErrNotStaged: publish before stage.
	ErrNotStaged = volerr.New(volerr.ErrPrecondition, "volume is not staged on this node")
	// ErrUnsupported: the volume asks for something this agent cannot do.
	ErrUnsupported = volerr.New(volerr.ErrPrecondition, "not supported")
	// ErrClusterDeleting: the volume's StorageCluster is being deleted, so
	// nothing of it may be staged any more.
	ErrClusterDeleting = volerr.New(volerr.ErrPrecondition, "storage cluster is being deleted")
	// ErrNotOwned: a Flexvolume pod names a Volume its namespace does not own.
	ErrNotOwned = volerr.New(volerr.ErrDenied, "volume not owned by the pod's namespace")
	// ErrIdentity: a Flexvolume call's options disagree with the pod that
	// kubelet's mount dir names.
	ErrIdentity = volerr.New(volerr.ErrDenied, "pod identity refused")
)
