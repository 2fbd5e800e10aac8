package blockdev

import (
	"bytes"
	"testing"

	"golang.org/x/sys/unix"
)

// A request of the largest size goes through the worker's pipe whole, and
// one after it too (the pipe is drained each time). A pipe stands in for
// /dev/fuse: splice moves from either; the real device is in the root
// tests (every server reads through its pipe).
func TestRequestPipeCarriesTheLargestRequest(t *testing.T) {
	// What a server negotiates fits the default fs.pipe-max-size; the
	// writes of an older server's connection need CAP_SYS_RESOURCE.
	p, err := newRequestPipe(initMaxWrite)
	if err != nil {
		t.Fatal(err)
	}
	defer p.close()
	var dev [2]int
	if err := unix.Pipe2(dev[:], unix.O_CLOEXEC); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = unix.Close(dev[0]); _ = unix.Close(dev[1]) }()
	if _, err := unix.FcntlInt(uintptr(dev[1]), unix.F_SETPIPE_SZ, pipeSize(initMaxWrite)); err != nil {
		t.Fatal(err)
	}
	b, err := newBuffers()
	if err != nil {
		t.Fatal(err)
	}
	defer b.free()
	for i, size := range []int{inHeaderSize + writeInSize + initMaxWrite, inHeaderSize} {
		req := bytes.Repeat([]byte{byte(i + 1)}, size)
		if _, err := unix.Write(dev[1], req); err != nil {
			t.Fatal(err)
		}
		n, err := p.readRequest(dev[0], b.in)
		if err != nil || !bytes.Equal(b.in[:n], req) {
			t.Fatalf("request %d (%d bytes): read %d, %v; want it whole", i, size, n, err)
		}
	}
}

func TestNoPipeReadsDirectly(t *testing.T) {
	var dev [2]int
	if err := unix.Pipe2(dev[:], unix.O_CLOEXEC); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = unix.Close(dev[0]); _ = unix.Close(dev[1]) }()
	if _, err := unix.Write(dev[1], []byte("request")); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 64)
	if n, err := noPipe.readRequest(dev[0], buf); err != nil || string(buf[:n]) != "request" {
		t.Fatalf("read %q, %v", buf[:n], err)
	}
	noPipe.close() // closes nothing
}
