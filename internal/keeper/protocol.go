// Package keeper holds each userspace volume's FUSE connection (the /dev/fuse
// fd) so that it outlives the blockdev server processes, and hands it to them
// over a root-only Unix socket. The keeper never does I/O on the connection:
// it opens, mounts, keeps, lends and closes, nothing else, so that it almost
// never needs an upgrade. An upgrade is a hand-over: the new keeper takes
// every connection and the listening socket from the old one (handover.go).
// A keeper that dies without handing over ends every connection it holds.
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
	// OpHandOver asks for everything the keeper holds, the listening
	// socket included: the asker is a new keeper taking over
	// (handover.go). The whole hand-over runs on that one connection.
	OpHandOver = "hand-over"
	// OpHandedOver is the new keeper's ack inside a hand-over, never a
	// request of its own.
	OpHandedOver = "handed-over"
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
	// ErrHandingOver means the keeper is handing its connections over to a
	// new keeper: the client retries and reaches the one that serves.
	ErrHandingOver = fmt.Errorf("%w: handing over to a new keeper", ErrBusy)
	// ErrUnavailable means the keeper cannot be reached.
	ErrUnavailable = volerr.New(volerr.ErrUnavailable, "keeper unavailable")
)

type request struct {
	Op         string          `json:"op"`
	Volume     string          `json:"volume,omitempty"`
	Mountpoint string          `json:"mountpoint,omitempty"`
	Settings   json.RawMessage `json:"settings,omitempty"`
	// Deadline (hand-over) is when the new keeper gives up, in Unix
	// nanoseconds; the old one gives up then too.
	Deadline int64 `json:"deadline,omitempty"`
	// Count (handed-over) is the volumes the new keeper took.
	Count int `json:"count,omitempty"`
}

type response struct {
	Error    string          `json:"error,omitempty"`
	Code     string          `json:"code,omitempty"`
	Settings json.RawMessage `json:"settings,omitempty"`
	Volumes  []Volume        `json:"volumes,omitempty"`
	// HandingOver marks ErrHandingOver. Its code stays busy, which
	// clients from before the hand-over know.
	HandingOver bool `json:"handingOver,omitempty"`
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
	case OpList, OpPing, OpHandOver:
		return nil
	case OpHandedOver:
		return fmt.Errorf("%w: op %q comes only inside a hand-over", volerr.ErrInvalid, r.Op)
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
	return response{Error: err.Error(), Code: code, HandingOver: errors.Is(err, ErrHandingOver)}
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
		if r.HandingOver {
			return fmt.Errorf("%w (%s)", ErrHandingOver, r.Error)
		}
		return fmt.Errorf("%w (%s)", ErrBusy, r.Error)
	}
	return errors.New(r.Error)
}

// Bounds of a hand-over's parts. Every part leaves room for the listening
// socket's fd, which rides with the last.
const (
	// maxPartFDs bounds the fds of one part, well below SCM_MAX_FD (253).
	maxPartFDs = 200
	// partBytes is where parts are cut; one volume's settings (a request's
	// worth at most) can make a part longer, up to maxPart.
	partBytes = 64 << 10
	maxPart   = 256 << 10
)

// handedVolume is one held connection in a hand-over. Its FUSE fd rides
// with its part, then its server's pidfd when Server is set.
type handedVolume struct {
	Name       string          `json:"name"`
	Mountpoint string          `json:"mountpoint"`
	Settings   json.RawMessage `json:"settings,omitempty"`
	// ServerPID is the server's pid as the old keeper sees it; the new
	// one reads its own from the pidfd.
	ServerPID int32 `json:"serverPID,omitempty"`
	Server    bool  `json:"server,omitempty"`
}

// handOverPart is one message from the old keeper in a hand-over: an error
// reply (its fields are a response's), volumes with their fds, or Done,
// the old keeper's confirmation that it stopped serving.
type handOverPart struct {
	Error string         `json:"error,omitempty"`
	Code  string         `json:"code,omitempty"`
	Held  []handedVolume `json:"held,omitempty"`
	// Total is the volumes of the whole hand-over, the same in every part.
	Total int `json:"total"`
	// Last parts carry the listening socket's fd after the volumes'.
	Last bool `json:"last,omitempty"`
	Done bool `json:"done,omitempty"`
}

// fds is how many fds ride with p.
func (p handOverPart) fds() int {
	n := len(p.Held)
	for _, v := range p.Held {
		if v.Server {
			n++
		}
	}
	if p.Last {
		n++
	}
	return n
}

// splitParts cuts vols into parts of at most maxPartFDs fds, the
// listener's slot included, and about partBytes of JSON.
func splitParts(vols []handedVolume) []handOverPart {
	var parts []handOverPart
	cur, fds, size := handOverPart{Total: len(vols)}, 1, 0
	for _, v := range vols {
		b, _ := json.Marshal(v)
		n := handOverPart{Held: []handedVolume{v}}.fds()
		if len(cur.Held) > 0 && (fds+n > maxPartFDs || size+len(b) > partBytes) {
			parts = append(parts, cur)
			cur, fds, size = handOverPart{Total: len(vols)}, 1, 0
		}
		cur.Held = append(cur.Held, v)
		fds, size = fds+n, size+len(b)
	}
	cur.Last = true
	return append(parts, cur)
}

// decodePart parses a part that came with nfds fds and checks what can be
// checked without them: an error reply is returned as its error.
func decodePart(b []byte, nfds int) (handOverPart, error) {
	var p handOverPart
	if err := json.Unmarshal(b, &p); err != nil {
		return p, fmt.Errorf("%w: hand-over message: %w", volerr.ErrInvalid, err)
	}
	if p.Error != "" {
		return p, response{Error: p.Error, Code: p.Code}.err()
	}
	if p.Done && (len(p.Held) > 0 || p.Last) {
		return p, fmt.Errorf("%w: hand-over confirmation with volumes", volerr.ErrInvalid)
	}
	if want := p.fds(); nfds != want || want > maxPartFDs || p.Total < 0 {
		return p, fmt.Errorf("%w: hand-over part of %d volumes (of %d) came with %d fds, want %d (at most %d)",
			volerr.ErrInvalid, len(p.Held), p.Total, nfds, want, maxPartFDs)
	}
	for _, v := range p.Held {
		if err := volid.Valid(v.Name); err != nil {
			return p, err
		}
		if !filepath.IsAbs(v.Mountpoint) || filepath.Clean(v.Mountpoint) != v.Mountpoint {
			return p, fmt.Errorf("%w: volume %s: mountpoint %q must be a clean absolute path", volerr.ErrInvalid, v.Name, v.Mountpoint)
		}
		if len(v.Settings) > 0 && !json.Valid(v.Settings) {
			return p, fmt.Errorf("%w: volume %s: settings are not JSON", volerr.ErrInvalid, v.Name)
		}
	}
	return p, nil
}
