package nfsclient

import (
	"context"
	"encoding/binary"
	"io"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"
)

// replayServer listens on loopback and answers each connection with stream,
// the bytes a server sent (RPC records as they were on the wire), then
// closes its side so that a client wanting more reads EOF at once. What the
// client sends is read and dropped.
func replayServer(t testing.TB, stream []byte) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				go func() {
					_, _ = c.Write(stream)
					_ = c.(*net.TCPConn).CloseWrite()
				}()
				_, _ = io.Copy(io.Discard, c)
				// The client has closed: a reset ends the connection with no
				// TIME_WAIT on either side, which would use up the loopback
				// ports at fuzzing speed.
				_ = c.(*net.TCPConn).SetLinger(0)
				_ = c.Close()
			}()
		}
	}()
	return ln.Addr().String()
}

// fuzzOps are the client calls a reply stream is replayed to; a seed's first
// argument picks the one its stream was recorded from.
var fuzzOps = []func(ctx context.Context, ep Endpoint) error{
	func(ctx context.Context, ep Endpoint) error { return CheckExport41(ctx, ep.Addr, ep.Export, 1, "test") },
	func(ctx context.Context, ep Endpoint) error { _, err := Statfs41(ctx, ep, 1, "test"); return err },
	func(ctx context.Context, ep Endpoint) error {
		_, err := WriteCommitRead41(ctx, ep, "probe.bin", []byte("berth probe\n"), 1, "test")
		return err
	},
	func(ctx context.Context, ep Endpoint) error {
		_, err := ReadFile41(ctx, ep, "probe.bin", 1, "test")
		return err
	},
	func(ctx context.Context, ep Endpoint) error { return Remove41(ctx, ep, "probe.bin", 1, "test") },
}

// FuzzReplies41 replays a server's byte stream to the NFSv4.1 client: the
// RPC record marking, the reply header and every operation's result
// decoder see it. Seeds (testdata/fuzz/FuzzReplies41) are streams a real
// nfs-ganesha sent (internal/share TestRootRecordNFSSeeds records them).
// Whatever the stream, the call returns, without a panic, before its
// deadline. Fuzz it with -fuzzminimizetime 100x: the network makes its
// coverage vary from run to run, and minimizing then runs for a minute.
func FuzzReplies41(f *testing.F) {
	f.Add(byte(0), []byte{})
	f.Fuzz(func(t *testing.T, op byte, stream []byte) {
		addr := replayServer(t, stream)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		start := time.Now()
		_ = fuzzOps[int(op)%len(fuzzOps)](ctx, Endpoint{Addr: addr, Export: "/pv1"})
		if d := time.Since(start); d > 4*time.Second {
			t.Fatalf("a replayed stream of %d bytes held the client %s", len(stream), d)
		}
	})
}

// record is one RPC reply record (last fragment) of msg.
func record(msg []byte) []byte {
	b := binary.BigEndian.AppendUint32(nil, 0x80000000|uint32(len(msg)))
	return append(b, msg...)
}

// TestShortReplyAllocatesLittle (F18): a reply that claims a 4 GiB opaque
// (here the RPC verifier's body) or a 1G-word GETATTR bitmap and then ends
// is refused without allocating what it claims. Before the fix the
// decoder made the claimed size on the short read.
func TestShortReplyAllocatesLittle(t *testing.T) {
	var e xdrEnc
	e.u32(1)          // xid of the first call
	e.u32(1)          // REPLY
	e.u32(0)          // accepted
	e.u32(0)          // verifier flavor
	e.u32(0xfffffff0) // verifier body: claims almost 4 GiB, has nothing
	hugeOpaque := record(e.b.Bytes())

	// Statfs41 past the session set-up: EXCHANGE_ID, CREATE_SESSION and
	// RECLAIM-less SEQUENCE answers, then a GETATTR result whose bitmap
	// claims 2^30 words.
	reply := func(xid uint32, body func(e *xdrEnc)) []byte {
		var e xdrEnc
		e.u32(xid)
		e.u32(1)
		e.u32(0)
		e.u32(0)
		e.u32(0)
		e.u32(0) // accepted: SUCCESS
		e.u32(0) // compound status
		e.opaque(nil)
		e.u32(1) // results
		body(&e)
		return record(e.b.Bytes())
	}
	var stream []byte
	stream = append(stream, reply(1, func(e *xdrEnc) { e.u32(opExchangeID); e.u32(0); e.u64(7); e.u32(1) })...)
	stream = append(stream, reply(2, func(e *xdrEnc) { e.u32(opCreateSession); e.u32(0); e.fixed(make([]byte, 16)) })...)
	stream = append(stream, reply(3, func(e *xdrEnc) {
		e.u32(opSequence)
		e.u32(0)
		e.fixed(make([]byte, 16))
		for range 5 {
			e.u32(0)
		}
		e.u32(opPutRootFH)
		e.u32(0)
		e.u32(opLookup)
		e.u32(0)
		e.u32(opGetAttr)
		e.u32(0)
		e.u32(1 << 30) // bitmap words
	})...)

	for _, c := range []struct {
		name   string
		op     int
		stream []byte
	}{{"opaque length", 0, hugeOpaque}, {"bitmap length", 1, stream}} {
		t.Run(c.name, func(t *testing.T) {
			addr := replayServer(t, c.stream)
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			err := fuzzOps[c.op](t.Context(), Endpoint{Addr: addr, Export: "/pv1"})
			runtime.ReadMemStats(&after)
			if err == nil {
				t.Fatal("a short reply was taken")
			}
			if got := after.TotalAlloc - before.TotalAlloc; got > 16<<20 {
				t.Errorf("a %d-byte reply made the client allocate %d MiB (%v)", len(c.stream), got>>20, err)
			}
		})
	}
}

// TestReplayedGaneshaStreams: each recorded stream, replayed to the call it
// was recorded from, succeeds; so the fuzz target starts from replies
// that reach every decoder, not from ones refused at the first record.
func TestReplayedGaneshaStreams(t *testing.T) {
	files, err := filepath.Glob(filepath.Join("testdata", "fuzz", "FuzzReplies41", "ganesha-*"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no recorded streams (%v)", err)
	}
	for _, name := range files {
		b, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		lines := strings.Split(strings.TrimSpace(string(b)), "\n")
		if len(lines) != 3 {
			t.Fatalf("%s: %d lines", name, len(lines))
		}
		op, err := strconv.Unquote(strings.TrimSuffix(strings.TrimPrefix(lines[1], "byte("), ")"))
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		stream, err := strconv.Unquote(strings.TrimSuffix(strings.TrimPrefix(lines[2], "[]byte("), ")"))
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		addr := replayServer(t, []byte(stream))
		if err := fuzzOps[int(op[0])%len(fuzzOps)](t.Context(), Endpoint{Addr: addr, Export: "/pv1"}); err != nil {
			t.Errorf("%s replayed: %v", filepath.Base(name), err)
		}
	}
}
