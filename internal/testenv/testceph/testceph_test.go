package testceph_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/berth-io/berth/internal/testenv"
	"github.com/berth-io/berth/internal/testenv/testceph"
)

var (
	cluster = testceph.New(testceph.TestOptions())
	suite   = cluster.Suite("testceph")
)

func TestMain(m *testing.M) { os.Exit(testenv.Main(m, suite)) }

func needCeph(tb testing.TB) *testceph.Cluster {
	tb.Helper()
	suite.Require(tb)
	return cluster
}

func ctxT(tb testing.TB) context.Context {
	return testenv.Context(tb, 5*time.Minute)
}

// newImage makes an image in the pool as the berth client and removes it
// when the test ends.
func newImage(t *testing.T, c *testceph.Cluster, name, size string) string {
	t.Helper()
	ctx := ctxT(t)
	spec := c.Pool + "/" + name
	if _, err := c.RBD(ctx, "create", "--size", size, "--image-feature", "layering,exclusive-lock", spec); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if _, err := c.RBD(context.Background(), "rm", "--no-progress", spec); err != nil {
			t.Errorf("remove %s: %v", spec, err)
		}
	})
	return spec
}

// writeAndVerify imports size random bytes as the new image spec and
// exports them back, comparing; it returns what it wrote.
func writeAndVerify(t *testing.T, c *testceph.Cluster, spec string, size int) []byte {
	t.Helper()
	want := make([]byte, size)
	if _, err := rand.Read(want); err != nil {
		t.Fatal(err)
	}
	in := filepath.Join(t.TempDir(), "in")
	if err := os.WriteFile(in, want, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := c.RBD(ctxT(t), "import", "--no-progress", "--image-feature", "layering,exclusive-lock", in, spec); err != nil {
		t.Fatal(err)
	}
	verify(t, c, spec, want)
	return want
}

// verify reads the image back and compares it with want.
func verify(t *testing.T, c *testceph.Cluster, spec string, want []byte) {
	t.Helper()
	out := filepath.Join(t.TempDir(), "out")
	if _, err := c.RBD(ctxT(t), "export", "--no-progress", spec, out); err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("%s: read back %d bytes that differ from the %d written", spec, len(got), len(want))
	}
}

func removeImage(t *testing.T, c *testceph.Cluster, spec string) {
	t.Helper()
	if _, err := c.RBD(ctxT(t), "rm", "--no-progress", spec); err != nil {
		t.Errorf("remove %s: %v", spec, err)
	}
}

// The berth client writes an image in its pool and reads back what it wrote,
// and rbd bench writes through librbd.
func TestBerthClientWritesAndReadsItsPool(t *testing.T) {
	c := needCeph(t)
	ctx := ctxT(t)
	spec := c.Pool + "/roundtrip"
	writeAndVerify(t, c, spec, 8<<20)
	defer removeImage(t, c, spec)

	bench := newImage(t, c, "bench", "64M")
	out, err := c.RBD(ctx, "bench", "--io-type", "write", "--io-size", "4K", "--io-threads", "16", "--io-total", "16M", "--io-pattern", "rand", bench)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(out), "elapsed:") {
		t.Fatalf("rbd bench printed no summary:\n%s", out)
	}
	t.Logf("rbd bench 4k random write: %s", lastLine(out))
}

// client.berth has `profile rbd` on its pool only: another pool's images and
// admin commands are refused.
func TestBerthClientRefusedOutsideItsPool(t *testing.T) {
	c := needCeph(t)
	ctx := ctxT(t)
	other := "berth-other"
	for _, args := range [][]string{
		{"osd", "pool", "create", other, "1", "1", "replicated"},
		{"osd", "pool", "application", "enable", other, "rbd"},
	} {
		if _, err := c.AdminCeph(ctx, args...); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		if _, err := c.AdminCeph(context.Background(), "osd", "pool", "delete", other, other, "--yes-i-really-really-mean-it"); err != nil {
			t.Errorf("delete pool %s: %v", other, err)
		}
	})
	// The same request in its own pool works (so the refusal below is the caps').
	newImage(t, c, "allowed", "4M")

	_, err := c.RBD(ctx, "create", "--size", "4M", other+"/refused")
	if err == nil {
		t.Fatalf("client.%s created an image in pool %s outside its caps", c.Client, other)
	}
	if !strings.Contains(err.Error(), "Operation not permitted") {
		t.Fatalf("create in %s: want a permission error, got: %v", other, err)
	}
	if _, err := c.Ceph(ctx, "osd", "pool", "create", "berth-refused", "1"); err == nil || !strings.Contains(err.Error(), "EACCES") {
		t.Fatalf("client.%s creating a pool: want a permission error, got: %v", c.Client, err)
	}
	// Nothing was made by the refused requests.
	if out, err := c.AdminCeph(ctx, "osd", "pool", "ls"); err != nil || strings.Contains(string(out), "berth-refused") {
		t.Fatalf("pools after a refused create: %v\n%s", err, out)
	}
	out, err := c.AdminCeph(ctx, "df")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("ceph df:\n%s", out)
}

// With one OSD of three killed (size 3, min_size 2) reads and writes go on;
// once it is back the pool heals and the data written meanwhile reads back.
func TestIOWithOneOSDDown(t *testing.T) {
	c := needCeph(t)
	ctx := ctxT(t)
	before := c.Pool + "/before-kill"
	wantBefore := writeAndVerify(t, c, before, 4<<20)
	defer removeImage(t, c, before)

	const osd = 1
	if err := c.KillOSD(ctx, osd); err != nil {
		t.Fatal(err)
	}
	restarted := false
	defer func() {
		if !restarted {
			if err := c.StartOSD(context.Background(), osd); err != nil {
				t.Errorf("restart osd.%d: %v", osd, err)
			}
		}
	}()
	start := time.Now()
	during := c.Pool + "/during-kill"
	wantDuring := writeAndVerify(t, c, during, 4<<20)
	defer removeImage(t, c, during)
	verify(t, c, before, wantBefore)
	t.Logf("I/O with osd.%d down: %s", osd, time.Since(start).Round(time.Millisecond))

	start = time.Now()
	if err := c.StartOSD(ctx, osd); err != nil {
		t.Fatal(err)
	}
	restarted = true
	if err := c.WaitHealthy(ctx); err != nil {
		t.Fatal(err)
	}
	t.Logf("osd.%d back and every placement group clean in %s", osd, time.Since(start).Round(time.Millisecond))
	// Both images read back from the healed pool, osd.1's recovered copies
	// among those serving them.
	verify(t, c, before, wantBefore)
	verify(t, c, during, wantDuring)
}

func lastLine(b []byte) string {
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	return lines[len(lines)-1]
}

// up.sh on a running cluster starts nothing new: the same cluster (fsid),
// one monitor, three OSDs.
func TestUpTwiceIsOneCluster(t *testing.T) {
	c := needCeph(t)
	ctx := ctxT(t)
	fsid := func() string {
		out, err := c.AdminCeph(ctx, "fsid")
		if err != nil {
			t.Fatal(err)
		}
		return strings.TrimSpace(string(out))
	}
	before := fsid()
	if err := c.Up(ctx); err != nil {
		t.Fatal(err)
	}
	if after := fsid(); after != before {
		t.Fatalf("fsid %s after a second up, %s before", after, before)
	}
	out, err := c.AdminCeph(ctx, "status")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"mon: 1 daemons", "osd: 3 osds: 3 up"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("ceph status after a second up lacks %q:\n%s", want, out)
		}
	}
}

// down.sh with nothing up succeeds and leaves nothing.
func TestDownWithNothingUp(t *testing.T) {
	needCeph(t)
	o := testceph.TestOptions()
	// Not the running cluster's ports either: leftovers.sh would rightly
	// report its daemons listening on them.
	o.Dir, o.MonPort, o.PortMin, o.PortMax = filepath.Join(t.TempDir(), "never-up"), 3399, 7900, 7909
	if err := testceph.New(o).Stop(ctxT(t)); err != nil {
		t.Fatal(err)
	}
}

// The keys by role (F5): the nodes' client may put a client on the
// blocklist (lock breaking) but never take one off; the operator's may.
func TestNodeClientOnlyAddsToTheBlocklist(t *testing.T) {
	c := needCeph(t)
	ctx := ctxT(t)
	const addr = "10.0.0.99:0/4242"
	t.Cleanup(func() { _, _ = c.AdminCeph(context.Background(), "osd", "blocklist", "rm", addr) })
	if out, err := c.NodeCeph(ctx, "osd", "blocklist", "add", addr); err != nil {
		t.Fatalf("client.%s adding %s to the blocklist: %v\n%s", c.NodeClient, addr, err, out)
	}
	if _, err := c.NodeCeph(ctx, "osd", "blocklist", "rm", addr); err == nil || !strings.Contains(err.Error(), "EACCES") {
		t.Fatalf("client.%s taking %s off the blocklist: want a permission error, got %v", c.NodeClient, addr, err)
	}
	if out, err := c.Ceph(ctx, "osd", "blocklist", "rm", addr); err != nil {
		t.Fatalf("client.%s taking %s off the blocklist: %v\n%s", c.Client, addr, err, out)
	}
}
