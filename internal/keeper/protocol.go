// Package keeper holds each userspace volume's FUSE connection (the /dev/fuse
// fd) so that it outlives the blockdev server processes, and hands it to them
// over a root-only Unix socket. The keeper never does I/O on the connection:
// it opens, mounts, keeps, lends and closes, nothing else, so that it almost
// never needs an upgrade. Its death ends every connection it holds.
package keeper

import (
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"

	"github.com/berth-io/berth/internal/volerr"
	"github.com/berth-io/berth/internal/volid"
)

// Request operations. One request and one reply per connection, each a single
// SOCK_SEQPACKET message; the reply carries the fd as SCM_RIGHTS.
const (
	OpOpen     = "open"
	OpGet      = "get"
	OpSaveInit = "save-init"
	OpClose    = "close"
	OpList     = "list"
	// OpStatus is one volume's entry of List (not-found when not held):
	// its reply stays small whatever the volumes held. Keepers before it
	// answer "unknown op"; the client then lists.
	OpStatus = "status"
	OpPing   = "ping"
	// OpStop ends the volume's server: SIGTERM, then SIGKILL. The keeper
	// signals it through its own pidfd, valid whatever PID namespace the
	// caller is in.
	OpStop = "stop"
)

// Error codes in replies, mapped to the sentinel errors below (and
// volerr.ErrInvalid for a malformed request; nothing changed). ErrNotFound
// and ErrConflict are of no volerr kind on purpose: they speak of the
// keeper's table, not of whether the volume exists, and must not reach CSI
// as NotFound or AlreadyExists.
const (
	codeNotFound = "not-found"
	codeInvalid  = "invalid"
	codeConflict = "conflict"
	codeServed   = "served"
	codeBusy     = "busy"
)

var (
	// ErrNotFound means the keeper holds no connection for the volume.
	ErrNotFound = errors.New("keeper holds no connection for the volume")
	// ErrConflict means the volume is held with another mountpoint, or the
	// mountpoint is already mounted by something the keeper does not hold
	// (e.g. a dead connection left by a previous keeper).
	ErrConflict = errors.New("keeper request conflicts with existing state")
	// ErrServed means another live process serves the connection (it
	// also matches ErrConflict); retry once that process has exited.
	ErrServed = fmt.Errorf("%w: connection served by another live process", ErrConflict)
	// ErrBusy means the keeper is at its client limit, or another operation
	// on the volume did not end in time; retry later.
	ErrBusy = volerr.New(volerr.ErrBusy, "keeper busy")
	// ErrUnavailable means the keeper cannot be reached.
	ErrUnavailable = volerr.New(volerr.ErrUnavailable, "keeper unavailable")
)

type request struct {
	Op         string          `json:"op"`
	Volume     string          `json:"volume,omitempty"`
	Mountpoint string          `json:"mountpoint,omitempty"`
	Settings   json.RawMessage `json:"settings,omitempty"`
}

type response struct {
	Error    string          `json:"error,omitempty"`
	Code     string          `json:"code,omitempty"`
	Settings json.RawMessage `json:"settings,omitempty"`
	Volumes  []Volume        `json:"volumes,omitempty"`
}

// Volume is one held connection as List reports it.
type Volume struct {
	Name       string `json:"name"`
	Mountpoint string `json:"mountpoint"`
	// Initialized says whether a server saved INIT settings.
	Initialized bool `json:"initialized"`
	// ServerPID is the live server process, 0 if none.
	ServerPID int `json:"serverPID,omitempty"`
}

// maxMessage bounds a request or a reply other than List's.
const maxMessage = 64 << 10

// maxListReply bounds List's reply, one message: about 180 bytes a volume,
// so ~5800 volumes (64 KiB held only ~350, and a longer reply was cut).
const maxListReply = 1 << 20

func (r request) validate() error {
	switch r.Op {
	case OpList, OpPing:
		return nil
	case OpOpen, OpGet, OpSaveInit, OpClose, OpStop, OpStatus:
	default:
		return fmt.Errorf("%w: unknown op %q", volerr.ErrInvalid, r.Op)
	}
	if err := volid.Valid(r.Volume); err != nil {
		return err
	}
	if r.Op == OpOpen && (!filepath.IsAbs(r.Mountpoint) || filepath.Clean(r.Mountpoint) != r.Mountpoint) {
		return fmt.Errorf("%w: mountpoint %q must be a clean absolute path", volerr.ErrInvalid, r.Mountpoint)
	}
	if r.Op == OpSaveInit && (len(r.Settings) == 0 || !json.Valid(r.Settings)) {
		return fmt.Errorf("%w: settings must be JSON", volerr.ErrInvalid)
	}
	return nil
}

func errorResponse(err error) response {
	code := ""
	switch {
	case errors.Is(err, ErrNotFound):
		code = codeNotFound
	case errors.Is(err, ErrServed):
		code = codeServed
	case errors.Is(err, volerr.ErrInvalid):
		code = codeInvalid
	case errors.Is(err, ErrBusy):
		code = codeBusy
	case errors.Is(err, ErrConflict):
		code = codeConflict
	}
	return response{Error: err.Error(), Code: code}
}

func (r response) err() error {
	if r.Error == "" {
		return nil
	}
	switch r.Code {
	case codeNotFound:
		return fmt.Errorf("%w (%s)", ErrNotFound, r.Error)
	case codeInvalid:
		return fmt.Errorf("%w (%s)", volerr.ErrInvalid, r.Error)
	case codeConflict:
		return fmt.Errorf("%w (%s)", ErrConflict, r.Error)
	case codeServed:
		return fmt.Errorf("%w (%s)", ErrServed, r.Error)
	case codeBusy:
		return fmt.Errorf("%w (%s)", ErrBusy, r.Error)
	}
	return errors.New(r.Error)
}
