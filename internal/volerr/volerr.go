// Package volerr is berth's one error vocabulary: the kinds of failure a
// caller (CSI, the agent socket, the healer) decides on. Packages keep their
// own sentinels for their own callers, but each one is of exactly one kind
// (New), so that the boundaries map kinds, never package errors, to codes
// (internal/agent/errcode).
package volerr

import "errors"

// The kinds. Each sentinel's text is what a bare kind prints.
var (
	// ErrInvalid: the request can never succeed as asked; nothing changed.
	ErrInvalid = errors.New("invalid argument")
	// ErrNotFound: the volume (or its image, or the named path) does not exist.
	ErrNotFound = errors.New("not found")
	// ErrExists: the name is taken by something made with other parameters.
	ErrExists = errors.New("already exists with other parameters")
	// ErrWrongNode: the volume lives on another node.
	ErrWrongNode = errors.New("volume belongs to another node")
	// ErrInUse: another pod, node or process holds the volume (or its device
	// is held open), so it cannot be taken or released now.
	ErrInUse = errors.New("in use")
	// ErrPrecondition: the volume is not in a state that allows the call
	// (not staged, its cluster is being deleted, it may hold data that a
	// format would destroy, the node cannot serve what it asks).
	ErrPrecondition = errors.New("precondition failed")
	// ErrNotReady: this agent does not serve the call yet; nothing changed.
	ErrNotReady = errors.New("not ready")
	// ErrUnavailable: a service the call needs (the keeper, the backend)
	// cannot be reached; retry later.
	ErrUnavailable = errors.New("unavailable")
	// ErrBusy: another operation on the volume is running, or updates kept
	// conflicting; retry later.
	ErrBusy = errors.New("busy")
	// ErrDenied: the caller may not do this.
	ErrDenied = errors.New("permission denied")
	// ErrNoSpace: the backend lacks room for the volume.
	ErrNoSpace = errors.New("not enough space")
)

// Kinds lists every kind, for tables that must cover them all.
func Kinds() []error {
	return []error{ErrInvalid, ErrNotFound, ErrExists, ErrWrongNode, ErrInUse, ErrPrecondition,
		ErrNotReady, ErrUnavailable, ErrBusy, ErrDenied, ErrNoSpace}
}

// New returns a package's own sentinel of a kind: its text is msg, it is
// itself for errors.Is, and it is kind too.
func New(kind error, msg string) error { return &sentinel{kind: kind, msg: msg} }

type sentinel struct {
	kind error
	msg  string
}

func (s *sentinel) Error() string { return s.msg }
func (s *sentinel) Unwrap() error { return s.kind }

// KindOf returns the kind of err (the first of Kinds it matches), or nil.
func KindOf(err error) error {
	for _, k := range Kinds() {
		if errors.Is(err, k) {
			return k
		}
	}
	return nil
}
