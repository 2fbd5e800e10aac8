package nbd

import (
	"bytes"
	"context"
	"errors"
	"io"
	"testing"

	"github.com/go-logr/logr"
	"golang.org/x/sys/unix"
)

// boundedImage is an image in memory that fails the test on any access
// outside it: Serve's checks must keep every request inside the image.
type boundedImage struct {
	t    *testing.T
	data []byte
}

// in reports an access outside the image (Errorf: it runs on Serve's
// goroutines, where Fatal would leave Serve waiting for them).
func (m *boundedImage) in(off, n int64) error {
	if off < 0 || n < 0 || off+n > int64(len(m.data)) {
		m.t.Errorf("backend access at %d+%d outside the %d-byte image", off, n, len(m.data))
		return unix.EIO
	}
	return nil
}

func (m *boundedImage) ReadAt(p []byte, off int64) (int, error) {
	if err := m.in(off, int64(len(p))); err != nil {
		return 0, err
	}
	return copy(p, m.data[off:]), nil
}

func (m *boundedImage) WriteAt(p []byte, off int64) (int, error) {
	if err := m.in(off, int64(len(p))); err != nil {
		return 0, err
	}
	return copy(m.data[off:], p), nil
}

func (m *boundedImage) Sync() error { return nil }

func (m *boundedImage) Fallocate(mode uint32, off, length int64) error {
	if err := m.in(off, length); err != nil {
		return err
	}
	if mode&(unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_ZERO_RANGE) == 0 {
		m.t.Errorf("fallocate mode %#x allocates", mode)
		return unix.EINVAL
	}
	clear(m.data[off : off+length])
	return nil
}

func (m *boundedImage) Size() int64 { return int64(len(m.data)) }

// fuzzImageSize is the fuzzed image: small, so that requests fall both
// inside and past its end.
const fuzzImageSize = 64 << 10

// kernelRequest is a request as the kernel's nbd driver writes it.
func kernelRequest(cmd, flags uint16, cookie, off uint64, length uint32, payload []byte) []byte {
	b := make([]byte, requestSize, requestSize+len(payload))
	putRequest(b, request{flags: flags, cmd: cmd, cookie: cookie, off: off, length: length})
	return append(b, payload...)
}

// FuzzServe runs a byte stream from "the kernel" through Serve with one
// worker, and checks every reply against a model of the image: one reply
// per request in order, the right errno, read data as last written.
// Seeds are the request sequences the kernel's nbd driver sends for mkfs,
// reads, FUA writes, discard and write-zeroes, then disconnect.
func FuzzServe(f *testing.F) {
	page := bytes.Repeat([]byte{0xab}, 4096)
	seq := [][]byte{
		kernelRequest(cmdRead, 0, 1, 0, 4096, nil),
		kernelRequest(cmdWrite, 0, 2, 4096, 4096, page),
		kernelRequest(cmdWrite, cmdFlagFUA, 3, 8192, 512, page[:512]),
		kernelRequest(cmdFlush, 0, 4, 0, 0, nil),
		kernelRequest(cmdTrim, 0, 5, 32768, 16384, nil),
		kernelRequest(cmdWriteZeroes, cmdFlagNoHole, 6, 4096, 4096, nil),
		kernelRequest(cmdRead, 0, 7, 4096, 8192, nil),
		kernelRequest(cmdDisc, 0, 8, 0, 0, nil),
	}
	f.Add(bytes.Join(seq, nil))
	f.Add(kernelRequest(cmdWrite, 0, 9, fuzzImageSize-512, 4096, page))
	f.Add(kernelRequest(cmdRead, 0, 10, 1<<63, 1<<31, nil))
	f.Add(kernelRequest(cmdWrite, 0, 11, 0, maxPayload+1, nil))
	f.Add(kernelRequest(cmdCache, 7, 12, 0, 0, nil))
	f.Fuzz(func(t *testing.T, stream []byte) {
		img := &boundedImage{t: t, data: make([]byte, fuzzImageSize)}
		model := make([]byte, fuzzImageSize)
		var out bytes.Buffer
		conn := struct {
			io.Reader
			io.Writer
		}{bytes.NewReader(stream), &out}
		err := Serve(context.Background(), conn, img, 1, logr.Discard())
		if t.Failed() {
			return
		}

		// Walk the stream as the protocol defines it, and the replies with it.
		in, replies := stream, out.Bytes()
		for len(in) >= requestSize {
			req, perr := parseRequest(in)
			if perr != nil {
				if !errors.Is(err, errBadMagic) {
					t.Fatalf("bad magic, Serve returned %v", err)
				}
				break
			}
			in = in[requestSize:]
			if req.cmd == cmdDisc {
				if err != nil {
					t.Fatalf("disconnect: Serve returned %v", err)
				}
				break
			}
			var payload []byte
			if req.cmd == cmdWrite {
				if uint64(len(in)) < uint64(req.length) {
					break // cut short: no reply
				}
				payload, in = in[:req.length], in[req.length:]
			}
			if len(replies) < replySize {
				t.Fatalf("no reply to %+v", req)
			}
			rep, rerr := parseReply(replies)
			if rerr != nil || rep.cookie != req.cookie {
				t.Fatalf("reply %+v, %v to %+v", rep, rerr, req)
			}
			replies = replies[replySize:]
			want := expectErrno(req)
			if rep.errno != want {
				t.Fatalf("%+v: errno %d, want %d", req, rep.errno, want)
			}
			if want != errnoOK {
				continue
			}
			end := req.off + uint64(req.length)
			switch req.cmd {
			case cmdRead:
				if uint64(len(replies)) < uint64(req.length) || !bytes.Equal(replies[:req.length], model[req.off:end]) {
					t.Fatalf("read %d+%d: data differs from what was written", req.off, req.length)
				}
				replies = replies[req.length:]
			case cmdWrite:
				copy(model[req.off:], payload)
			case cmdTrim, cmdWriteZeroes:
				clear(model[req.off:end])
			}
		}
		if len(replies) != 0 {
			t.Fatalf("%d bytes of replies to no request", len(replies))
		}
		if !bytes.Equal(img.data, model) {
			t.Fatal("image differs from the model")
		}
		if err == nil && !bytes.Contains(stream, []byte{0x25, 0x60, 0x95, 0x13}) {
			t.Fatal("Serve ended cleanly without a request")
		}
	})
}

// expectErrno is the protocol's answer to req on a fuzzImageSize image.
func expectErrno(req request) uint32 {
	known := uint16(cmdFlagFUA)
	if req.cmd == cmdWriteZeroes {
		known |= cmdFlagNoHole
	}
	if (req.cmd == cmdWrite || req.cmd == cmdRead) && req.length > maxPayload {
		return errnoInval
	}
	if req.flags&^known != 0 {
		return errnoInval
	}
	switch req.cmd {
	case cmdFlush:
		return errnoOK
	case cmdRead, cmdWrite, cmdTrim, cmdWriteZeroes:
		end := req.off + uint64(req.length)
		if end >= req.off && end <= fuzzImageSize {
			return errnoOK
		}
		if req.cmd == cmdWrite || req.cmd == cmdWriteZeroes {
			return errnoNoSpc
		}
		return errnoInval
	}
	return errnoInval
}

// FuzzHeaders: request and reply headers decode what they encode, and short
// input is an error, never a panic.
func FuzzHeaders(f *testing.F) {
	f.Add(kernelRequest(cmdWrite, cmdFlagFUA, 0x1122334455667788, 4096, 4096, nil))
	f.Add([]byte{0x67, 0x44, 0x66, 0x98, 0, 0, 0, 5, 1, 2, 3, 4, 5, 6, 7, 8})
	f.Add([]byte{0x25, 0x60})
	f.Fuzz(func(t *testing.T, b []byte) {
		if r, err := parseRequest(b); err == nil {
			var again [requestSize]byte
			putRequest(again[:], r)
			if !bytes.Equal(again[:], b[:requestSize]) {
				t.Fatalf("request %x re-encoded as %x", b[:requestSize], again)
			}
		} else if len(b) >= requestSize && !errors.Is(err, errBadMagic) {
			t.Fatalf("%d bytes: %v", len(b), err)
		}
		if r, err := parseReply(b); err == nil {
			var again [replySize]byte
			putReply(again[:], r.errno, r.cookie)
			if !bytes.Equal(again[:], b[:replySize]) {
				t.Fatalf("reply %x re-encoded as %x", b[:replySize], again)
			}
		}
	})
}
