package blockdev

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/go-logr/logr"
	"golang.org/x/sys/unix"

	"github.com/berth-io/berth/internal/blockdev/imagefile"
)

// fuseBench is a server on a real image whose replies go to a socket pair
// instead of /dev/fuse, so that any request bytes can be handed to it.
type fuseBench struct {
	img   *imagefile.Image
	path  string
	b     *buffers
	dev   int // the server's end
	kern  int // "the kernel's" end: replies arrive here
	reply []byte
}

const fuzzImageSize = 64 << 10

func newFuseBench(f *testing.F) *fuseBench {
	dir := f.TempDir()
	// tmpfs when there is one: a truncate per input on a disk mounted with
	// discard is slow.
	if d, err := os.MkdirTemp("/dev/shm", "berth-fuzz-fuse-"); err == nil {
		dir = d
		f.Cleanup(func() { _ = os.RemoveAll(d) })
	}
	path := filepath.Join(dir, "disk.img")
	if err := os.WriteFile(path, nil, 0o600); err != nil {
		f.Fatal(err)
	}
	img, err := imagefile.Open(path, false)
	if err != nil {
		f.Fatal(err)
	}
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		f.Fatal(err)
	}
	// A READ reply carries up to maxWrite bytes in one message.
	for _, fd := range fds {
		_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_SNDBUFFORCE, 4*maxWrite)
		_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, 4*maxWrite)
	}
	if err := unix.SetNonblock(fds[1], true); err != nil {
		f.Fatal(err)
	}
	b, err := newBuffers()
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() {
		b.free()
		_ = unix.Close(fds[0])
		_ = unix.Close(fds[1])
		_ = img.Close()
	})
	return &fuseBench{img: img, path: path, b: b, dev: fds[0], kern: fds[1], reply: make([]byte, outHeaderSize+maxWrite+pageSize)}
}

// replies drains what the server sent.
func (fb *fuseBench) replies(t *testing.T) [][]byte {
	var out [][]byte
	for {
		n, err := unix.Read(fb.kern, fb.reply)
		if errors.Is(err, unix.EAGAIN) {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, bytes.Clone(fb.reply[:n]))
	}
}

// splitRequests cuts a stream the way /dev/fuse delivers it: each request
// as long as its header says; a bad length takes the rest.
func splitRequests(stream []byte) [][]byte {
	var out [][]byte
	for len(stream) > 0 {
		n := len(stream)
		if len(stream) >= inHeaderSize {
			if l := int(le.Uint32(stream)); l >= inHeaderSize && l <= len(stream) {
				n = l
			}
		}
		out = append(out, stream[:n])
		stream = stream[n:]
	}
	return out
}

// FuzzFUSERequests hands request streams to the FUSE server and checks each
// reply against the protocol and the image. Seeds (testdata) are requests
// the kernel (6.18) sent to a real mounted server while losetup, dd,
// blkdiscard, truncate and fallocate ran on it.
func FuzzFUSERequests(f *testing.F) {
	fb := newFuseBench(f)
	f.Fuzz(func(t *testing.T, stream []byte) {
		if err := fb.img.Truncate(fuzzImageSize); err != nil {
			t.Fatal(err)
		}
		s, err := NewServer(Config{Dev: fb.dev, Image: fb.img, Log: logr.Discard()})
		if err != nil {
			t.Fatal(err)
		}
		for _, req := range splitRequests(stream) {
			n := min(len(req), len(fb.b.in))
			copy(fb.b.in, req[:n])
			var h inHeader
			if n >= inHeaderSize {
				h = parseInHeader(fb.b.in)
				if h.opcode == opFallocate && n >= inHeaderSize+28 {
					// The bench only: a fallocate that allocates would fill
					// the disk with a fuzzed length.
					body := fb.b.in[inHeaderSize:]
					if le.Uint32(body[24:])&unix.FALLOC_FL_PUNCH_HOLE == 0 {
						le.PutUint64(body[16:], min(le.Uint64(body[16:]), 1<<20))
					}
				}
			}
			if err := s.handle(fb.b, n); err != nil {
				t.Fatalf("request %x: %v", req[:min(n, 64)], err)
			}
			got := fb.replies(t)
			silent := n < inHeaderSize || h.opcode == opForget || h.opcode == opBatchForget || h.opcode == opInterrupt
			if silent {
				if len(got) != 0 {
					t.Fatalf("opcode %d answered", h.opcode)
				}
				continue
			}
			if len(got) != 1 {
				t.Fatalf("opcode %d: %d replies", h.opcode, len(got))
			}
			checkReply(t, fb, s, h, fb.b.in[inHeaderSize:n], got[0])
		}
	})
}

func checkReply(t *testing.T, fb *fuseBench, s *Server, h inHeader, body, r []byte) {
	if len(r) < outHeaderSize || int(le.Uint32(r)) != len(r) || le.Uint64(r[8:]) != h.unique {
		t.Fatalf("opcode %d: reply header %x", h.opcode, r[:min(len(r), outHeaderSize)])
	}
	errno := int32(le.Uint32(r[4:]))
	payload := r[outHeaderSize:]
	if errno > 0 || (errno < 0 && len(payload) != 0) {
		t.Fatalf("opcode %d: errno %d with %d bytes", h.opcode, errno, len(payload))
	}
	if errno != 0 {
		return
	}
	switch h.opcode {
	case opInit:
		in := parseInitIn(body)
		if len(payload) != initOutSize(in.Minor) {
			t.Fatalf("INIT minor %d: %d-byte reply", in.Minor, len(payload))
		}
		var out [64]byte
		copy(out[:], payload)
		major, minor, flags := le.Uint32(out[0:]), le.Uint32(out[4:]), uint64(le.Uint32(out[12:]))|uint64(le.Uint32(out[32:]))<<32
		if major != protoMajor || minor != min(in.Minor, protoMinor) || (len(payload) == 64 && flags&^in.Flags != 0) {
			t.Fatalf("INIT %+v answered %d.%d flags %#x", in, major, minor, flags)
		}
		set := s.settings.Load()
		b, err := set.Marshal()
		if err != nil {
			t.Fatal(err)
		}
		if back, err := ParseSettings(b); err != nil || *back != *set {
			t.Fatalf("settings %+v do not survive the keeper: %+v, %v", set, back, err)
		}
	case opRead:
		off, size := int64(le.Uint64(body[8:])), int(le.Uint32(body[16:]))
		want := make([]byte, min(size, maxWrite))
		m, _ := unix.Pread(int(fb.img.Fd()), want, off)
		if !bytes.Equal(payload, want[:max(m, 0)]) {
			t.Fatalf("READ %d+%d: %d bytes that are not the image's", off, size, len(payload))
		}
	case opWrite:
		off, size := int64(le.Uint64(body[8:])), int(le.Uint32(body[16:]))
		if len(payload) != 8 || int(le.Uint32(payload)) != size {
			t.Fatalf("WRITE of %d answered %x", size, payload)
		}
		got := make([]byte, size)
		if m, _ := unix.Pread(int(fb.img.Fd()), got, off); m != size || !bytes.Equal(got, body[writeInSize:writeInSize+size]) {
			t.Fatalf("WRITE %d+%d: image holds other data", off, size)
		}
		if fb.img.Size() < off+int64(size) {
			t.Fatalf("WRITE %d+%d: size %d", off, size, fb.img.Size())
		}
	case opGetattr, opSetattr:
		if len(payload) != 16+attrSize {
			t.Fatalf("attr reply of %d bytes", len(payload))
		}
		if ino := le.Uint64(payload[16:]); ino != h.nodeID {
			t.Fatalf("attr of node %d for node %d", ino, h.nodeID)
		}
		if h.nodeID == fileID {
			st, err := os.Stat(fb.path)
			if err != nil || le.Uint64(payload[24:]) != uint64(st.Size()) {
				t.Fatalf("file size %d, image %v %v", le.Uint64(payload[24:]), st.Size(), err)
			}
		}
	}
}

// FuzzInit negotiates any INIT body, and checks that the answer takes only
// what the kernel offered and survives the keeper (Marshal, ParseSettings).
func FuzzInit(f *testing.F) {
	// The kernel's (6.18) real fuse_init_in, minor 45.
	kernel := append([]byte{7, 0, 0, 0, 45, 0, 0, 0, 0, 0, 2, 0, 0xfb, 0xff, 0xff, 0x73, 0xfd, 0x05, 0, 0}, make([]byte, 44)...)
	f.Add(kernel, true)
	f.Add(kernel, false)
	f.Add(kernel[:16], false)
	f.Add([]byte{7, 0, 0, 0, 22, 0, 0, 0}, false)
	f.Fuzz(func(t *testing.T, body []byte, passthrough bool) {
		if len(body) < 16 {
			return // doInit answers EINVAL first
		}
		in := parseInitIn(body)
		set := negotiate(in, passthrough)
		if set.Out.Flags&^in.Flags != 0 || set.Out.Minor > in.Minor || set.Out.Minor > protoMinor {
			t.Fatalf("%+v answered %+v", in, set.Out)
		}
		if set.Passthrough() && (!passthrough || in.Flags&initPassthru == 0) {
			t.Fatal("passthrough neither asked nor offered")
		}
		if set.Out.MaxWrite != initMaxWrite || int(set.Out.MaxPages)*pageSize != initMaxWrite || initMaxWrite > maxWrite {
			t.Fatalf("max write %d, pages %d: not what a request pipe and the buffers hold", set.Out.MaxWrite, set.Out.MaxPages)
		}
		b, err := set.Marshal()
		if err != nil {
			t.Fatal(err)
		}
		if back, err := ParseSettings(b); in.Major == protoMajor && (err != nil || *back != set) {
			t.Fatalf("settings round trip: %+v, %v", back, err)
		}
		if negotiate(in, passthrough) != set {
			t.Fatal("a resent INIT gets another answer")
		}
	})
}

// FuzzSettings parses saved INIT settings as a server taking a connection
// over reads them from the keeper: what it accepts, it can serve.
func FuzzSettings(f *testing.F) {
	// What a server saved after the kernel's (6.18) real INIT, without and
	// with passthrough.
	f.Add([]byte(`{"in":{"major":7,"minor":45,"maxReadahead":131072,"flags":6586131021819},"out":{"major":7,"minor":40,"maxReadahead":131072,"flags":4227105,"maxBackground":256,"congestionThreshold":192,"maxWrite":1048576,"timeGran":1,"maxPages":256}}`))
	f.Add([]byte(`{"in":{"major":7,"minor":45,"maxReadahead":131072,"flags":6586131021819},"out":{"major":7,"minor":40,"maxReadahead":131072,"flags":138448633889,"maxBackground":256,"congestionThreshold":192,"maxWrite":1048576,"timeGran":1,"maxPages":256,"maxStackDepth":1},"backingID":1}`))
	f.Add([]byte(`{"out":{"major":7,"maxWrite":4194304}}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		s, err := ParseSettings(b)
		if err != nil || s == nil {
			if s != nil {
				t.Fatal("settings with an error")
			}
			return
		}
		if s.Out.Major != protoMajor || s.Out.MaxWrite == 0 || s.Out.MaxWrite > maxWrite {
			t.Fatalf("accepted settings this server cannot serve: %+v", s.Out)
		}
		again, err := s.Marshal()
		if err != nil {
			t.Fatal(err)
		}
		if back, err := ParseSettings(again); err != nil || *back != *s {
			t.Fatalf("round trip: %+v, %v", back, err)
		}
	})
}
