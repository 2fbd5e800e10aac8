package keeper

import (
	"bytes"
	"encoding/json"
	"errors"
	"path/filepath"
	"strings"
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
	// pidfds marks the open fds that stand for pidfds.
	pidfds map[int]bool
	// mountedAll: every mountpoint is mounted but those naming "gone".
	mountedAll  bool
	closedTwice bool
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
	return ok || (k.mountedAll && !strings.Contains(mountpoint, "gone")), nil
}

func (k *fuzzKernel) CloseFD(fd int) error {
	k.calls++
	if !k.open[fd] {
		k.closedTwice = true
		return errors.New("closed an fd twice")
	}
	delete(k.open, fd)
	return nil
}

func (k *fuzzKernel) WatchProcess(int32) (Process, error) { k.calls++; return livePID{}, nil }

// CheckFUSE takes any fd the harness opened for a FUSE connection.
func (k *fuzzKernel) CheckFUSE(fd int) error {
	k.calls++
	if !k.open[fd] || k.pidfds[fd] {
		return errors.New("not a FUSE fd")
	}
	return nil
}

// AdoptProcess takes any fd the harness opened for a pidfd.
func (k *fuzzKernel) AdoptProcess(fd int) (Process, int32, error) {
	k.calls++
	if !k.open[fd] || !k.pidfds[fd] {
		return nil, 0, errors.New("not a pidfd")
	}
	return adopted{k: k, fd: fd}, 7, nil
}

type livePID struct{}

func (livePID) Alive() bool { return false }
func (livePID) Release()    {}
func (livePID) FD() int     { return -1 }

// adopted is a passed pidfd, closed through the kernel.
type adopted struct {
	k  *fuzzKernel
	fd int
}

func (adopted) Alive() bool              { return true }
func (adopted) Stop(time.Duration) error { return nil }
func (a adopted) Release()               { _ = a.k.CloseFD(a.fd) }
func (a adopted) FD() int                { return a.fd }

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

// FuzzHandOverParts runs hand-over messages from an old keeper, one per
// line, through the new keeper's decoding and checks (decodePart, then
// intake.add, as takeOver does) on a kernel without side effects. Each
// part comes with the fds it announces, one fewer or one more as the
// line's first byte says. Whatever the input, every fd ends up either
// held or closed, once, and what is held is valid; discarding leaves none.
func FuzzHandOverParts(f *testing.F) {
	part := func(p handOverPart) string {
		b, _ := json.Marshal(p)
		return "1" + string(b)
	}
	vol := func(name string, server bool) handedVolume {
		return handedVolume{Name: name, Mountpoint: "/var/lib/berth/fuse/" + name, Settings: json.RawMessage(realSettings), ServerPID: 4242, Server: server}
	}
	two := []handedVolume{vol("pvc-3f2a9c1e-6b7d-4e8f-9a0b-1c2d3e4f5a6b", true), vol("pvc-1", false)}
	f.Add(part(handOverPart{Held: two, Total: 2, Last: true}))
	f.Add(part(handOverPart{Held: two[:1], Total: 2}) + "\n" + part(handOverPart{Held: two[1:], Total: 2, Last: true}))
	f.Add(part(handOverPart{Held: []handedVolume{two[0], two[0]}, Total: 2, Last: true}))
	f.Add(part(handOverPart{Held: []handedVolume{vol("gone", true)}, Total: 1, Last: true}))
	f.Add("0" + part(handOverPart{Held: two, Total: 2, Last: true})[1:])
	f.Add(`1{"done":true}`)
	f.Add(`1{"error":"keeper busy: an operation in progress did not end","code":"busy"}`)
	f.Fuzz(func(t *testing.T, data string) {
		k := &fuzzKernel{open: map[int]bool{}, mounts: map[string]int{}, pidfds: map[int]bool{}, mountedAll: true}
		in := &intake{kernel: k, vols: map[string]*held{}, mounts: map[string]string{}}
		for _, line := range strings.Split(data, "\n") {
			if line == "" {
				continue
			}
			var announced handOverPart
			_ = json.Unmarshal([]byte(line[1:]), &announced)
			// The fds as announced (volume, then pidfd), then any extra.
			var fds []int
			for _, v := range announced.Held {
				if len(fds) >= maxPartFDs {
					break
				}
				fds = append(fds, k.fake(false))
				if v.Server {
					fds = append(fds, k.fake(true))
				}
			}
			if announced.Last {
				fds = append(fds, k.fake(false))
			}
			switch line[0] % 3 {
			case 0:
				if len(fds) > 0 {
					_ = k.CloseFD(fds[len(fds)-1])
					fds = fds[:len(fds)-1]
				}
			case 2:
				fds = append(fds, k.fake(false))
			}
			p, err := decodePart([]byte(line[1:]), len(fds))
			if err != nil {
				in.closeFDs(fds) // readPart's part
				continue
			}
			if p.Done || (p.fds() != len(fds)) {
				in.closeFDs(fds)
				continue
			}
			vfds := fds
			if p.Last {
				vfds = fds[:len(fds)-1]
				in.closeFDs(fds[len(fds)-1:]) // the listener, not fuzzed
			}
			_ = in.add(p.Held, vfds)
			if k.closedTwice {
				t.Fatal("an fd was closed twice")
			}
			held := map[int]bool{}
			for name, h := range in.vols {
				if volid.Valid(name) != nil || !filepath.IsAbs(h.mountpoint) || filepath.Clean(h.mountpoint) != h.mountpoint {
					t.Fatalf("took %q at %q", name, h.mountpoint)
				}
				if in.mounts[h.mountpoint] != name || strings.Contains(h.mountpoint, "gone") {
					t.Fatalf("took %s at %s, unmounted or shared", name, h.mountpoint)
				}
				if len(h.settings) > 0 && !json.Valid(h.settings) {
					t.Fatalf("took %s with settings that are not JSON", name)
				}
				held[h.fd] = true
				if h.server != nil {
					held[h.server.FD()] = true
				}
			}
			for fd := range k.open {
				if !held[fd] {
					t.Fatalf("fd %d neither held nor closed", fd)
				}
			}
		}
		in.discard()
		if len(k.open) != 0 || k.closedTwice {
			t.Fatalf("after discard: %d fds open, closed twice %v", len(k.open), k.closedTwice)
		}
	})
}

// fake opens a fake fd, a pidfd when pid.
func (k *fuzzKernel) fake(pid bool) int {
	k.next++
	k.open[k.next] = true
	if pid {
		k.pidfds[k.next] = true
	}
	return k.next
}
