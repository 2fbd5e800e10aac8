package fence

import (
	"errors"
	"fmt"

	v1 "github.com/berth-io/berth/api/v1alpha1"
	"github.com/berth-io/berth/internal/volerr"
)

// ErrRefused marks a stale entry the node's Undoer will never undo (a path
// outside the node's volume folders, a malformed volume name): the Cleaner
// takes it off the list, undoing nothing, and reports it.
var ErrRefused = errors.New("stale entry refused")

// ErrTooManyRetries marks an operation that kept losing optimistic-concurrency
// races; the caller may try again later.
var ErrTooManyRetries = volerr.New(volerr.ErrBusy, "fence: too many conflicting updates")

// ErrNotHeld: a node reports Ceph clients of a volume it holds no entry
// of (its hold was broken or released meanwhile): the record would not
// land, and the device must not be used.
var ErrNotHeld = volerr.New(volerr.ErrPrecondition, "fence: the node holds no entry of the volume")

// ErrTerminating marks an Attachment that is being deleted: no hold is
// added to it (its finalizers may keep it, and what it held, for any
// time); the caller tries again once it is gone.
var ErrTerminating = volerr.New(volerr.ErrBusy, "fence: attachment is being deleted")

// ConflictError says the volume is held by someone the access mode excludes
// and whose hold could not be broken. It is volerr.ErrInUse (CSI:
// FailedPrecondition). A request that can never succeed as asked (missing
// fields, a read-write request on a ReadOnlyMany volume) is
// volerr.ErrInvalid; nothing was changed.
type ConflictError struct {
	// Volume is the contested volume.
	Volume string
	// Mode is the access mode the Attachment was granted under.
	Mode v1.AccessMode
	// Holder is the entry that blocks the request.
	Holder v1.AttachmentEntry
	// Reason says which rule refused the request.
	Reason string
}

// Unwrap makes a ConflictError match volerr.ErrInUse.
func (e *ConflictError) Unwrap() error { return volerr.ErrInUse }

func (e *ConflictError) Error() string {
	return fmt.Sprintf("volume %s (%s) is held by %s: %s", e.Volume, e.Mode, Describe(e.Holder), e.Reason)
}

// Describe names an entry's holder: pod and node, or the node's stage record.
func Describe(h v1.AttachmentEntry) string {
	if h.IsStage() {
		return fmt.Sprintf("node %s (staged at %s)", h.Node, h.MountDir)
	}
	return fmt.Sprintf("pod %s/%s (uid %s) on node %s", h.PodNamespace, h.Pod, h.PodUID, h.Node)
}
