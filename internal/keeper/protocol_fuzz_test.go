package keeper

import (
	"bytes"
	"encoding/json"
	"errors"
	"path/filepath"
	"testing"
	"time"

	"github.com/go-logr/logr"

	"github.com/berth-io/berth/internal/volerr"
	"github.com/berth-io/berth/internal/volid"
)

// fuzzKernel hands out fd numbers without opening anything, so that any
// request sequence runs without side effects; it counts what is open.
type fuzzKernel struct {
	next   int
	open   map[int]bool
	mounts map[string]int
	calls  int
}

func (k *fuzzKernel) OpenFUSE() (int, error) {
	k.calls++
	k.next++
	k.open[k.next] = true
	return k.next, nil
}

func (k *fuzzKernel) MountFUSE(fd int, _, mountpoint string) error {
	k.calls++
	k.mounts[mountpoint] = fd
	return nil
}

func (k *fuzzKernel) Unmount(mountpoint string) error {
	k.calls++
	delete(k.mounts, mountpoint)
	return nil
}

func (k *fuzzKernel) Mounted(mountpoint string) (bool, error) {
	k.calls++
	_, ok := k.mounts[mountpoint]
	return ok, nil
}

func (k *fuzzKernel) CloseFD(fd int) error {
	k.calls++
	if !k.open[fd] {
		return errors.New("closed an fd twice")
	}
	delete(k.open, fd)
	return nil
}

func (k *fuzzKernel) WatchProcess(int32) (Process, error) { k.calls++; return livePID{}, nil }

type livePID struct{}

func (livePID) Alive() bool { return false }
func (livePID) Release()    {}

// Stop: the fuzzed process is never alive, so it is gone at once.
func (livePID) Stop(time.Duration) error { return nil }

// realSettings are the INIT settings a server saved after the kernel's (6.18)
// real INIT on this project's test machine.
const realSettings = `{"in":{"major":7,"minor":45,"maxReadahead":131072,"flags":6586131021819},"out":{"major":7,"minor":40,"maxReadahead":131072,"flags":4227105,"maxBackground":256,"congestionThreshold":192,"maxWrite":1048576,"timeGran":1,"maxPages":256}}`

func message(t testing.TB, r request) []byte {
	b, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// FuzzKeeperRequests runs request messages, one per line, through the
// keeper's decode, validation and handling on a kernel without side effects.
// Seeds are the messages the blockdev server and agent send (open, save-init,
// get, list, close) in the order of a volume's life.
func FuzzKeeperRequests(f *testing.F) {
	life := [][]byte{
		message(f, request{Op: OpPing}),
		message(f, request{Op: OpOpen, Volume: "pvc-3f2a9c1e-6b7d-4e8f-9a0b-1c2d3e4f5a6b", Mountpoint: "/var/lib/berth/fuse/pvc-3f2a9c1e-6b7d-4e8f-9a0b-1c2d3e4f5a6b"}),
		message(f, request{Op: OpSaveInit, Volume: "pvc-3f2a9c1e-6b7d-4e8f-9a0b-1c2d3e4f5a6b", Settings: json.RawMessage(realSettings)}),
		message(f, request{Op: OpGet, Volume: "pvc-3f2a9c1e-6b7d-4e8f-9a0b-1c2d3e4f5a6b"}),
		message(f, request{Op: OpList}),
		message(f, request{Op: OpClose, Volume: "pvc-3f2a9c1e-6b7d-4e8f-9a0b-1c2d3e4f5a6b"}),
	}
	f.Add(bytes.Join(life, []byte("\n")))
	for _, m := range life {
		f.Add(m)
	}
	f.Add([]byte(`{"op":"open","volume":"a","mountpoint":"/m/../m"}` + "\n" + `{"op":"open","volume":"b","mountpoint":"/m"}`))
	f.Add([]byte(`{"op":"save-init","volume":"a","settings":[1,}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		k := &fuzzKernel{open: map[int]bool{}, mounts: map[string]int{}}
		s := New(k, logr.Discard())
		for _, msg := range bytes.Split(data, []byte("\n")) {
			var req request
			if err := json.Unmarshal(msg, &req); err != nil {
				continue // the keeper answers ErrInvalid before handle
			}
			if req.validate() != nil {
				continue // so does it for a request that fails validation
			}
			calls, before := k.calls, len(s.vols)
			resp, fd := s.handle(req, 42)
			if err := resp.err(); err != nil {
				if fd >= 0 {
					t.Fatalf("%s: an fd passed with error %v", req.Op, err)
				}
				if errors.Is(err, volerr.ErrInvalid) && (k.calls != calls || len(s.vols) != before) {
					t.Fatalf("%s: an invalid request changed state", req.Op)
				}
			} else {
				if (req.Op == OpOpen || req.Op == OpGet) != (fd >= 0) {
					t.Fatalf("%s: fd %d", req.Op, fd)
				}
				if req.Op == OpOpen && s.vols[req.Volume].mountpoint != req.Mountpoint {
					t.Fatalf("open %s at %s holds %s", req.Volume, req.Mountpoint, s.vols[req.Volume].mountpoint)
				}
				if req.Op == OpSaveInit && !json.Valid(s.vols[req.Volume].settings) {
					t.Fatal("saved settings are not JSON")
				}
			}
			// The reply encodes (a SEQPACKET message) and decodes to the same error.
			b, err := json.Marshal(resp)
			if err != nil || len(b) > maxMessage*2 {
				t.Fatalf("reply of %d bytes: %v", len(b), err)
			}
			var back response
			if err := json.Unmarshal(b, &back); err != nil || (back.err() == nil) != (resp.err() == nil) {
				t.Fatalf("reply round trip: %v", err)
			}
			// Invariants of what is held.
			seen := map[string]string{}
			for name, h := range s.vols {
				if volid.Valid(name) != nil {
					t.Fatalf("holds invalid volume name %q", name)
				}
				if !filepath.IsAbs(h.mountpoint) || filepath.Clean(h.mountpoint) != h.mountpoint {
					t.Fatalf("holds unclean mountpoint %q", h.mountpoint)
				}
				if other, dup := seen[h.mountpoint]; dup {
					t.Fatalf("%s and %s share mountpoint %s", name, other, h.mountpoint)
				}
				seen[h.mountpoint] = name
				if !k.open[h.fd] || k.mounts[h.mountpoint] != h.fd {
					t.Fatalf("%s holds fd %d that is closed or not mounted", name, h.fd)
				}
			}
			if len(k.open) != len(s.vols) {
				t.Fatalf("%d fds open for %d held volumes", len(k.open), len(s.vols))
			}
		}
	})
}

// FuzzKeeperReply feeds the client's reply decoding (what call does with a
// reply message): any error code maps to one sentinel, and the keeper's own
// error replies keep theirs.
func FuzzKeeperReply(f *testing.F) {
	for _, err := range []error{ErrNotFound, volerr.ErrInvalid, ErrConflict, ErrServed, errors.New("mount fuse at /m: permission denied")} {
		b, _ := json.Marshal(errorResponse(err))
		f.Add(b)
	}
	f.Add(message(f, request{}))
	b, _ := json.Marshal(response{Settings: json.RawMessage(realSettings)})
	f.Add(b)
	b, _ = json.Marshal(response{Volumes: []Volume{{Name: "pvc-1", Mountpoint: "/var/lib/berth/fuse/pvc-1", Initialized: true, ServerPID: 4242}}})
	f.Add(b)
	f.Fuzz(func(t *testing.T, data []byte) {
		var resp response
		if err := json.Unmarshal(data, &resp); err != nil {
			return
		}
		err := resp.err()
		if (err == nil) != (resp.Error == "") {
			t.Fatalf("error %q gave %v", resp.Error, err)
		}
		if err == nil {
			return
		}
		n := 0
		for _, s := range []error{ErrNotFound, volerr.ErrInvalid, ErrServed} {
			if errors.Is(err, s) {
				n++
			}
		}
		if n > 1 {
			t.Fatalf("%v matches %d sentinels", err, n)
		}
		// The keeper's own reply for this error decodes to the same class.
		again := errorResponse(err)
		if again.Code != resp.Code && (resp.Code == codeNotFound || resp.Code == codeInvalid || resp.Code == codeConflict || resp.Code == codeServed) {
			t.Fatalf("code %q became %q", resp.Code, again.Code)
		}
	})
}
