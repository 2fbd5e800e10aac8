// Package socket is the node agent's local API: a Unix socket that only
// root may use, one JSON request and one JSON response per connection. The
// Flexvolume driver that kubelet executes is its main client.
package socket

import (
	"google.golang.org/grpc/codes"

	"github.com/berth-io/berth/internal/agent/errcode"
	"github.com/berth-io/berth/internal/flexvolume"
	"github.com/berth-io/berth/internal/volerr"
)

// Version of the protocol; the handshake tells the client. Version 2 answers
// failures with the gRPC code names of internal/agent/errcode, the table the
// CSI server answers with too; version 1 had codes of its own, which
// Response.Err still reads (a driver may talk to an agent not yet upgraded).
const Version = 2

// Limits: a request is small (a few options); mounting may take a while.
const (
	MaxRequestBytes = 64 << 10
)

// Operations.
const (
	OpHandshake = "handshake"
	OpMount     = "mount"
	OpUnmount   = "unmount"
)

// Error codes (version 2) the server sets itself; the others come from
// errcode.Code. Each is a codes.Code's String().
const (
	CodeInvalid  = "InvalidArgument"
	CodeBusy     = "Aborted"
	CodeDenied   = "PermissionDenied"
	CodeInternal = "Internal"
	// CodeNotReady: the agent does not serve mounts yet (its Flexvolume
	// driver's init handshake has not reached it); nothing was changed.
	CodeNotReady = "Unavailable"
)

// Request is one call.
type Request struct {
	Op string `json:"op"`
	// Mount is set for OpMount.
	Mount *flexvolume.MountRequest `json:"mount,omitempty"`
	// MountDir is set for OpUnmount.
	MountDir string `json:"mountDir,omitempty"`
}

// Response answers one call.
type Response struct {
	OK      bool   `json:"ok"`
	Code    string `json:"code,omitempty"`
	Message string `json:"message,omitempty"`
	// Handshake
	Version int    `json:"version,omitempty"`
	Node    string `json:"node,omitempty"`
}

// Err is a failed reply as an error of the volerr kind its code names (nil
// when OK). It reads the codes of both protocol versions.
func (r Response) Err() error {
	if r.OK {
		return nil
	}
	return &ReplyError{Code: r.Code, Message: r.Message, kind: codeKind(r.Code)}
}

// ReplyError is a failure the agent answered.
type ReplyError struct {
	Code, Message string
	kind          error
}

func (e *ReplyError) Error() string { return e.Code + ": " + e.Message }

// Unwrap gives the reply's kind (nil for Internal and unknown codes).
func (e *ReplyError) Unwrap() error { return e.kind }

// codeKind reads a version 2 code (a gRPC code name) or a version 1 one.
func codeKind(code string) error {
	for c := codes.OK; c <= codes.Unauthenticated; c++ {
		if c.String() == code {
			return errcode.Kind(c)
		}
	}
	switch code { // version 1
	case "Invalid":
		return volerr.ErrInvalid
	case "Busy":
		return volerr.ErrBusy
	case "Conflict":
		// Mostly a volume held by another pod or node; version 1 also said
		// Conflict for "staged otherwise" and "cluster deleting".
		return volerr.ErrInUse
	case "Denied":
		return volerr.ErrDenied
	case "NotReady":
		return volerr.ErrNotReady
	}
	return nil
}
