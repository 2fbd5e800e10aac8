// Package errcode is the one table from berth's error kinds (internal/volerr)
// to gRPC codes. The CSI server and the agent socket both answer with it, so
// a failure reads the same to kubelet and to the Flexvolume driver.
package errcode

import (
	"context"
	"errors"

	"google.golang.org/grpc/codes"

	"github.com/berth-io/berth/internal/volerr"
)

// Row maps one kind to its code; Why says why that code is the right one.
type Row struct {
	Kind error
	Code codes.Code
	Why  string
}

// Table is matched in order; an error of no kind is Internal. The codes are
// the ones the CSI spec names for node calls. Where the agent socket used to
// differ, the CSI code won (the socket's version 2).
func Table() []Row {
	return []Row{
		{volerr.ErrInvalid, codes.InvalidArgument, "a field is missing or malformed; retrying the same call cannot help"},
		{volerr.ErrNotFound, codes.NotFound, "CSI: the volume does not exist"},
		{volerr.ErrExists, codes.AlreadyExists,
			"CSI NodeStage/NodePublish: staged or published already, but incompatible with this call (the socket said Conflict)"},
		// The generic precondition comes before its specific kinds, so that
		// Kind(FailedPrecondition) reads back as the generic one.
		{volerr.ErrPrecondition, codes.FailedPrecondition,
			"the volume exists but its state forbids the call (not staged, cluster deleting, may hold data, has snapshots)"},
		{volerr.ErrWrongNode, codes.FailedPrecondition,
			"the volume exists, on another node; NotFound would tell the CO it is gone (the socket said NotFound)"},
		{volerr.ErrInUse, codes.FailedPrecondition,
			"held by another pod or node, or its device is held open; like ControllerPublish's 'published to another node' (the socket said Conflict)"},
		{volerr.ErrUnavailable, codes.Unavailable, "a service the call needs is down; the CO retries with backoff"},
		{volerr.ErrNotReady, codes.Unavailable, "this agent does not serve the call yet; nothing changed, retry"},
		{volerr.ErrBusy, codes.Aborted, "CSI: an operation is pending for the volume; retry"},
		{volerr.ErrDenied, codes.PermissionDenied, "the caller may not touch this volume"},
		{volerr.ErrNoSpace, codes.ResourceExhausted, "CSI: not enough capacity for the volume"},
	}
}

// Code is err's code: OK for nil, the first Table row err matches, then
// the context's DeadlineExceeded and Canceled, else Internal.
func Code(err error) codes.Code {
	if err == nil {
		return codes.OK
	}
	for _, r := range Table() {
		if errors.Is(err, r.Kind) {
			return r.Code
		}
	}
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		return codes.DeadlineExceeded
	case errors.Is(err, context.Canceled):
		return codes.Canceled
	}
	return codes.Internal
}

// Kind reads a code back as the first kind that maps to it (nil for codes
// of no kind, such as Internal): for clients that get only the code.
func Kind(c codes.Code) error {
	for _, r := range Table() {
		if r.Code == c {
			return r.Kind
		}
	}
	return nil
}
