package nfsclient

import (
	"context"
	"errors"
	"net"
	"syscall"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	"k8s.io/utils/clock"
)

// fakeWriteServer answers one COMPOUND of PUTROOTFH, two LOOKUPs and WRITE
// with status for the WRITE (and count bytes written when 0), and returns
// the offset and length that the WRITE asked for.
func fakeWriteServer(t *testing.T, status, count uint32) (Options, <-chan [2]uint64) {
	got := make(chan [2]uint64, 1)
	dial := func(ctx context.Context, _, _ string) (net.Conn, error) {
		client, server := net.Pipe()
		go func() {
			defer server.Close()
			req, err := readRecord(server)
			if err != nil {
				t.Errorf("fake server: %v", err)
				return
			}
			d := &xdrDec{b: req}
			xid := d.u32()
			for range 5 { // CALL, RPC version, program, version, procedure
				d.u32()
			}
			d.u32()
			d.opaque() // credential
			d.u32()
			d.opaque() // verifier
			d.opaque() // tag
			if minor := d.u32(); minor != 0 {
				t.Errorf("minor version %d, want 0", minor)
			}
			if n := d.u32(); n != 4 {
				t.Errorf("%d operations, want PUTROOTFH, LOOKUP pv1, LOOKUP f, WRITE", n)
			}
			d.u32() // PUTROOTFH
			for range 2 {
				d.u32()    // LOOKUP
				d.opaque() // its name
			}
			if op := d.u32(); op != opWrite {
				t.Errorf("third operation %d, want WRITE", op)
			}
			if stateid := d.fixed(16); string(stateid) != string(make([]byte, 16)) {
				t.Errorf("stateid %x, want the anonymous one", stateid)
			}
			off := d.u64()
			d.u32() // stable
			data := d.opaque()
			got <- [2]uint64{off, uint64(len(data))}
			var e xdrEnc
			e.u32(xid)
			e.u32(1) // REPLY
			e.u32(0) // accepted
			e.u32(0) // verifier
			e.u32(0)
			e.u32(0)      // SUCCESS
			e.u32(status) // compound status
			e.opaque(nil)
			e.u32(4)
			e.u32(opPutRootFH)
			e.u32(0)
			for range 2 {
				e.u32(opLookup)
				e.u32(0)
			}
			e.u32(opWrite)
			e.u32(status)
			if status == 0 {
				e.u32(count)
				e.u32(2)
				e.fixed(make([]byte, 8))
			}
			_ = writeRecord(server, e.b.Bytes())
		}()
		return client, nil
	}
	return Options{Dial: dial, OpTimeout: 5 * time.Second}, got
}

// TestShortWriteGivesTheServersStatus: a write that the library reports
// short ends with the status a second WRITE gets, not retried when it is
// NOSPC; a second WRITE that goes through leaves a retryable error.
func TestShortWriteGivesTheServersStatus(t *testing.T) {
	data := make([]byte, 100<<10)
	opts, asked := fakeWriteServer(t, 28, 0)
	c := New(Endpoint{Addr: "fake:2049", Export: "/pv1"}, opts, clock.RealClock{}, testr.New(t))
	err := c.shortWrite(context.Background(), "/pv1/f", data, 4096)
	if !errors.Is(err, syscall.ENOSPC) || retryable(err) {
		t.Errorf("short write on a full server: %v (retryable %v), want ENOSPC, not retryable", err, retryable(err))
	}
	if a := <-asked; a != [2]uint64{4096, writeStatusChunk} {
		t.Errorf("second WRITE at %d of %d bytes, want at 4096 of %d", a[0], a[1], writeStatusChunk)
	}
	t.Log(err)

	opts, _ = fakeWriteServer(t, 0, 10)
	c = New(Endpoint{Addr: "fake:2049", Export: "/pv1"}, opts, clock.RealClock{}, testr.New(t))
	if err := c.shortWrite(context.Background(), "/pv1/f", data, 0); err == nil || !retryable(err) {
		t.Errorf("short write when the second WRITE goes through: %v, want a retryable error", err)
	}

	opts, _ = fakeWriteServer(t, 10013, 0) // NFS4ERR_GRACE passes on its own
	c = New(Endpoint{Addr: "fake:2049", Export: "/pv1"}, opts, clock.RealClock{}, testr.New(t))
	if err := c.shortWrite(context.Background(), "/pv1/f", data, 0); !retryable(err) {
		t.Errorf("short write in the grace period: %v, want a retryable error", err)
	}
}
