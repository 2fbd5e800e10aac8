package share_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/berth-io/berth/internal/share/nfsclient"
	"github.com/berth-io/berth/internal/share/sharetest"
)

// TestRootRecordNFSSeeds records what a real nfs-ganesha sends to each call
// that nfsclient.FuzzReplies41 replays, as that target's seed corpus. It
// runs only with BERTH_RECORD_NFS_SEEDS=1 (it rewrites files under
// nfsclient/testdata); the calls and their arguments must stay those of
// fuzzOps there.
func TestRootRecordNFSSeeds(t *testing.T) {
	if os.Getenv("BERTH_RECORD_NFS_SEEDS") != "1" {
		t.Skip("records fuzz seeds only with BERTH_RECORD_NFS_SEEDS=1")
	}
	g := sharetest.Start(t, 1, 2)
	ops := []struct {
		name string
		call func(ctx context.Context, ep nfsclient.Endpoint) error
	}{
		{"check", func(ctx context.Context, ep nfsclient.Endpoint) error {
			return nfsclient.CheckExport41(ctx, ep.Addr, ep.Export, 1, "test")
		}},
		{"statfs", func(ctx context.Context, ep nfsclient.Endpoint) error {
			_, err := nfsclient.Statfs41(ctx, ep, 1, "test")
			return err
		}},
		{"write-commit-read", func(ctx context.Context, ep nfsclient.Endpoint) error {
			_, err := nfsclient.WriteCommitRead41(ctx, ep, "probe.bin", []byte("berth probe\n"), 1, "test")
			return err
		}},
		{"read", func(ctx context.Context, ep nfsclient.Endpoint) error {
			_, err := nfsclient.ReadFile41(ctx, ep, "probe.bin", 1, "test")
			return err
		}},
		{"remove", func(ctx context.Context, ep nfsclient.Endpoint) error {
			return nfsclient.Remove41(ctx, ep, "probe.bin", 1, "test")
		}},
	}
	dir := filepath.Join("nfsclient", "testdata", "fuzz", "FuzzReplies41")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for i, op := range ops {
		addr, got := recordingProxy(t, g.Endpoint.Addr)
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		err := op.call(ctx, nfsclient.Endpoint{Addr: addr, Export: g.Endpoint.Export})
		cancel()
		if err != nil {
			t.Fatalf("%s through the recorder: %v", op.name, err)
		}
		seed := fmt.Sprintf("go test fuzz v1\nbyte(%s)\n[]byte(%s)\n", strconv.QuoteRune(rune(i)), strconv.Quote(string(got())))
		if err := os.WriteFile(filepath.Join(dir, "ganesha-"+op.name), []byte(seed), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// recordingProxy forwards one connection to server and returns its address
// and what the server sent, complete once the connection closed.
func recordingProxy(t *testing.T, server string) (string, func() []byte) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	var (
		wg  sync.WaitGroup
		buf bytes.Buffer
	)
	wg.Go(func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		s, err := net.Dial("tcp", server)
		if err != nil {
			t.Errorf("dial ganesha: %v", err)
			return
		}
		defer s.Close()
		go func() { _, _ = io.Copy(s, c); _ = s.(*net.TCPConn).CloseWrite() }()
		_, _ = io.Copy(io.MultiWriter(c, &buf), s)
	})
	return ln.Addr().String(), func() []byte { wg.Wait(); return buf.Bytes() }
}
