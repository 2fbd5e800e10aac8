// Package socket is the node agent's local API: a Unix socket that only
// root may use, one JSON request and one JSON response per connection. The
// Flexvolume driver that kubelet executes is its main client.
package socket

import (
	"github.com/berth-io/berth/internal/flexvolume"
)

// Version of the protocol; the handshake tells the client.
const Version = 1

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

// Error codes a client can decide on.
const (
	CodeInvalid  = "Invalid"
	CodeBusy     = "Busy"
	CodeConflict = "Conflict"
	CodeNotFound = "NotFound"
	CodeDenied   = "Denied"
	CodeInternal = "Internal"
	// CodeNotReady: the agent does not serve mounts yet (its Flexvolume
	// driver's init handshake has not reached it); nothing was changed.
	CodeNotReady = "NotReady"
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
