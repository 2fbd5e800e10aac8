//go:build ceph

package ceph_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	"google.golang.org/grpc/codes"

	"github.com/berth-io/berth/internal/agent/errcode"
	"github.com/berth-io/berth/internal/backend"
	"github.com/berth-io/berth/internal/backend/ceph"
	"github.com/berth-io/berth/internal/testenv"
	"github.com/berth-io/berth/internal/testenv/testceph"
	"github.com/berth-io/berth/internal/volerr"
)

// testOptions: this binary's own test Ceph (folder and ports), so that it
// never stops one that testceph's own tests (or a hand-made one) use.
func testOptions() testceph.Options {
	return testceph.Options{Dir: "/var/lib/berth-ceph-backend-test", Addr: "127.0.0.1", MonPort: 3311, PortMin: 7000, PortMax: 7099}
}

var (
	cluster = testceph.New(testOptions())
	suite   = cluster.Suite("ceph backend")
)

func TestMain(m *testing.M) { os.Exit(testenv.Main(m, suite)) }

func ctxT(tb testing.TB) context.Context {
	return testenv.Context(tb, 2*time.Minute)
}

// clientKey reads client.berth's secret from its keyring.
func clientKey(t *testing.T) string {
	t.Helper()
	k, err := cluster.ClientKey()
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func config(t *testing.T) ceph.Config {
	return ceph.Config{
		Monitors: cluster.MonHost, Pool: cluster.Pool,
		Client: cluster.Client, Key: clientKey(t),
		ConnectTimeout: 5 * time.Second, OpTimeout: 20 * time.Second,
	}
}

func open(t *testing.T) *ceph.Backend {
	t.Helper()
	suite.Require(t)
	b, err := ceph.New(ctxT(t), config(t), testr.New(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.Close)
	return b
}

func rbd(t *testing.T, args ...string) string {
	t.Helper()
	out, err := cluster.RBD(ctxT(t), args...)
	if err != nil {
		t.Fatal(err)
	}
	return string(out)
}

// export reads an image (or IMAGE@SNAP) as the berth client.
func export(t *testing.T, spec string) []byte {
	t.Helper()
	out := filepath.Join(t.TempDir(), "out")
	rbd(t, "export", "--no-progress", spec, out)
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// berthImages lists the pool's images made by berth.
func berthImages(t *testing.T) []string {
	var out []string
	for _, n := range strings.Fields(rbd(t, "ls", cluster.Pool)) {
		if strings.HasPrefix(n, "berth-") {
			out = append(out, n)
		}
	}
	return out
}

func wantErr(t *testing.T, err, target error) {
	t.Helper()
	if !errors.Is(err, target) {
		t.Fatalf("want %v, got %v", target, err)
	}
}

// TestNoAdminSocket: a connection makes no admin socket (F21). librados'
// default is /var/run/ceph/<cluster>-<name>.<pid>.<cctid>.asok, and it
// answers `config show`, key included, to whoever can reach it.
func TestNoAdminSocket(t *testing.T) {
	run := "/var/run/ceph"
	if _, err := os.Stat(run); err != nil {
		t.Skipf("%s: %v: librados would make no socket here anyway", run, err)
	}
	open(t)
	socks, err := filepath.Glob(filepath.Join(run, fmt.Sprintf("*.%d.*.asok", os.Getpid())))
	if err != nil {
		t.Fatal(err)
	}
	if len(socks) != 0 {
		t.Errorf("admin sockets of this process: %v", socks)
	}
}

// Create, Get, List, idempotency by ID, Expand and Delete, as client.berth.
func TestVolumeLifecycle(t *testing.T) {
	b := open(t)
	ctx := ctxT(t)
	img, err := b.Create(ctx, "vol-a", 10<<20+1)
	if err != nil {
		t.Fatal(err)
	}
	if want := int64(10<<20 + 4096); img.Size != want || img.Path != cluster.Pool+"/berth-vol-a" {
		t.Fatalf("created %+v, want size %d at %s/berth-vol-a", img, want, cluster.Pool)
	}
	info := rbd(t, "info", img.Path)
	if !strings.Contains(info, "features: layering, exclusive-lock") {
		t.Fatalf("image features:\n%s", info)
	}
	again, err := b.Create(ctx, "vol-a", 10<<20+1)
	if err != nil || again != img {
		t.Fatalf("second create: %+v, %v; want %+v", again, err, img)
	}
	_, err = b.Create(ctx, "vol-a", 20<<20)
	wantErr(t, err, backend.ErrExists)
	got, err := b.Get(ctx, "vol-a")
	if err != nil || got != img {
		t.Fatalf("get: %+v, %v", got, err)
	}
	list, err := b.List(ctx)
	if err != nil || len(list) != 1 || list[0] != img {
		t.Fatalf("list: %+v, %v", list, err)
	}
	_, err = b.Get(ctx, "nope")
	wantErr(t, err, backend.ErrNotFound)
	_, err = b.Create(ctx, "../x", 1<<20)
	wantErr(t, err, volerr.ErrInvalid)

	grown, err := b.Expand(ctx, "vol-a", 32<<20)
	if err != nil || grown.Size != 32<<20 {
		t.Fatalf("expand: %+v, %v", grown, err)
	}
	if !strings.Contains(rbd(t, "info", img.Path), "size 32 MiB") {
		t.Fatalf("rbd info after expand:\n%s", rbd(t, "info", img.Path))
	}
	if same, err := b.Expand(ctx, "vol-a", 32<<20); err != nil || same.Size != 32<<20 {
		t.Fatalf("expand to the same size: %+v, %v", same, err)
	}
	_, err = b.Expand(ctx, "vol-a", 1<<20)
	wantErr(t, err, volerr.ErrInvalid)
	_, err = b.Expand(ctx, "nope", 1<<20)
	wantErr(t, err, backend.ErrNotFound)

	if err := b.Delete(ctx, "vol-a"); err != nil {
		t.Fatal(err)
	}
	_, err = b.Get(ctx, "vol-a")
	wantErr(t, err, backend.ErrNotFound)
	if err := b.Delete(ctx, "vol-a"); err != nil {
		t.Fatalf("second delete: %v", err)
	}
	if imgs := berthImages(t); len(imgs) != 0 {
		t.Fatalf("images left: %v", imgs)
	}
}

// Snapshots are RBD snapshots; volumes cloned from a snapshot or a volume
// have its content, are flattened (independent of it), and any of them can
// be deleted after.
func TestSnapshotsAndClones(t *testing.T) {
	b := open(t)
	ctx := ctxT(t)
	src, err := b.Create(ctx, "src", 8<<20)
	if err != nil {
		t.Fatal(err)
	}
	rbd(t, "bench", "--io-type", "write", "--io-size", "64K", "--io-total", "4M", "--io-pattern", "rand", src.Path)
	snap, err := b.CreateSnapshot(ctx, "snap-1", "src")
	if err != nil {
		t.Fatal(err)
	}
	if snap.SourceID != "src" || snap.Size != 8<<20 || snap.Path != src.Path+"@berth-snap-snap-1" ||
		time.Since(snap.CreatedAt) > time.Minute {
		t.Fatalf("snapshot %+v", snap)
	}
	if again, err := b.CreateSnapshot(ctx, "snap-1", "src"); err != nil || again != snap {
		t.Fatalf("second create snapshot: %+v, %v; want %+v", again, err, snap)
	}
	_, err = b.CreateSnapshot(ctx, "snap-1", "other")
	wantErr(t, err, backend.ErrExists)
	_, err = b.CreateSnapshot(ctx, "snap-2", "missing")
	wantErr(t, err, backend.ErrNotFound)
	if l, err := b.ListSnapshots(ctx); err != nil || len(l) != 1 || l[0] != snap {
		t.Fatalf("list snapshots: %+v, %v", l, err)
	}
	want := export(t, snap.Path)
	if bytes.Equal(want, make([]byte, len(want))) {
		t.Fatal("snapshot reads as zeros: rbd bench wrote nothing?")
	}
	// The source changes after the snapshot; the snapshot's clone must not.
	rbd(t, "bench", "--io-type", "write", "--io-size", "64K", "--io-total", "4M", "--io-pattern", "rand", src.Path)

	start := time.Now()
	fromSnap, err := b.CreateFromSnapshot(ctx, "from-snap", "snap-1", 16<<20)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("clone from a snapshot (8 MiB, flattened) in %s", time.Since(start).Round(time.Millisecond))
	if fromSnap.Size != 16<<20 {
		t.Fatalf("clone of snapshot: %+v", fromSnap)
	}
	if got := export(t, fromSnap.Path); !bytes.Equal(got[:len(want)], want) || !bytes.Equal(got[len(want):], make([]byte, len(got)-len(want))) {
		t.Fatal("the clone of the snapshot differs from the snapshot")
	}
	if info := rbd(t, "info", fromSnap.Path); strings.Contains(info, "parent:") {
		t.Fatalf("clone not flattened:\n%s", info)
	}
	if again, err := b.CreateFromSnapshot(ctx, "from-snap", "snap-1", 16<<20); err != nil || again != fromSnap {
		t.Fatalf("second clone of snapshot: %+v, %v", again, err)
	}
	_, err = b.CreateFromVolume(ctx, "from-snap", "src", 16<<20)
	wantErr(t, err, backend.ErrExists)
	_, err = b.CreateFromSnapshot(ctx, "too-small", "snap-1", 4<<20)
	wantErr(t, err, volerr.ErrInvalid)
	_, err = b.CreateFromSnapshot(ctx, "no-snap", "missing", 16<<20)
	wantErr(t, err, backend.ErrNotFound)

	fromVol, err := b.CreateFromVolume(ctx, "from-vol", "src", 8<<20)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(export(t, fromVol.Path), export(t, src.Path)) {
		t.Fatal("the clone of the volume differs from the volume")
	}
	// Only the user's snapshot is left on the source: the temporary one is gone.
	if snaps := rbd(t, "snap", "ls", src.Path); strings.Contains(snaps, "berth-tmp-") || !strings.Contains(snaps, "berth-snap-snap-1") {
		t.Fatalf("snapshots of the source:\n%s", snaps)
	}
	_, err = b.CreateFromVolume(ctx, "no-vol", "missing", 8<<20)
	wantErr(t, err, backend.ErrNotFound)

	err = b.Delete(ctx, "src")
	wantErr(t, err, ceph.ErrHasSnapshots)
	if c := errcode.Code(err); c != codes.FailedPrecondition {
		t.Errorf("a volume with snapshots answers %v at CSI, want FailedPrecondition", c)
	}
	for _, id := range []string{"snap-1", "snap-1"} {
		if err := b.DeleteSnapshot(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	_, err = b.GetSnapshot(ctx, "snap-1")
	wantErr(t, err, backend.ErrNotFound)
	for _, id := range []string{"src", "from-snap", "from-vol"} {
		if err := b.Delete(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	if imgs := berthImages(t); len(imgs) != 0 {
		t.Fatalf("images left: %v", imgs)
	}
}

// An image without a record (a create that died midway) is not a volume,
// and the next create of its ID replaces it.
func TestLeftoverImageIsCollected(t *testing.T) {
	b := open(t)
	ctx := ctxT(t)
	rbd(t, "create", "--size", "4M", cluster.Pool+"/berth-leftover")
	_, err := b.Get(ctx, "leftover")
	wantErr(t, err, backend.ErrNotFound)
	img, err := b.Create(ctx, "leftover", 8<<20)
	if err != nil || img.Size != 8<<20 {
		t.Fatalf("create over a leftover: %+v, %v", img, err)
	}
	if err := b.Delete(ctx, "leftover"); err != nil {
		t.Fatal(err)
	}
}

// Capacity is the pool's max_avail, capped by its byte quota.
func TestCapacity(t *testing.T) {
	b := open(t)
	ctx := ctxT(t)
	free, err := b.Capacity(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// 3 OSDs of 4 GiB, size 3: at most one OSD's worth.
	if free <= 0 || free > 4<<30 {
		t.Fatalf("capacity %d", free)
	}
	t.Logf("capacity %d MiB", free>>20)
	if _, err := cluster.AdminCeph(ctx, "osd", "pool", "set-quota", cluster.Pool, "max_bytes", strconv.Itoa(100<<20)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if _, err := cluster.AdminCeph(context.Background(), "osd", "pool", "set-quota", cluster.Pool, "max_bytes", "0"); err != nil {
			t.Error(err)
		}
	})
	capped, err := b.Capacity(ctx)
	if err != nil || capped > 100<<20 || capped <= 0 {
		t.Fatalf("capacity with a 100 MiB quota: %d, %v", capped, err)
	}
}

// A refused key, a missing pool and unreachable monitors each give an error
// that says so, quickly; a ctx deadline shorter than the connect timeout
// wins.
func TestConnectErrors(t *testing.T) {
	suite.Require(t)
	other, err := exec.Command("ceph-authtool", "--gen-print-key").Output()
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name   string
		change func(*ceph.Config)
		ctx    time.Duration
		want   string
		is     error
		within time.Duration
	}{
		{"refused key", func(c *ceph.Config) { c.Key = strings.TrimSpace(string(other)) }, time.Minute, "key refused", nil, 10 * time.Second},
		{"unknown client", func(c *ceph.Config) { c.Client = "nobody" }, time.Minute, "key refused", nil, 10 * time.Second},
		{"missing pool", func(c *ceph.Config) { c.Pool = "no-such-pool" }, time.Minute, "open pool no-such-pool", backend.ErrNotFound, 10 * time.Second},
		{"missing data pool", func(c *ceph.Config) { c.DataPool = "no-such-pool" }, time.Minute, "open data pool no-such-pool", backend.ErrNotFound, 10 * time.Second},
		{"wrong monitors", func(c *ceph.Config) { c.Monitors = "127.0.0.1:1"; c.ConnectTimeout = 2 * time.Second }, time.Minute, "monitors unreachable", nil, 10 * time.Second},
		{"ctx deadline", func(c *ceph.Config) { c.Monitors = "127.0.0.1:1"; c.ConnectTimeout = time.Minute }, 500 * time.Millisecond, "connect to ceph", context.DeadlineExceeded, 2 * time.Second},
		{"bad feature", func(c *ceph.Config) { c.Features = []string{"layering", "nonsense"} }, time.Minute, "unknown name", volerr.ErrInvalid, time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := config(t)
			tc.change(&cfg)
			ctx, cancel := context.WithTimeout(context.Background(), tc.ctx)
			defer cancel()
			start := time.Now()
			b, err := ceph.New(ctx, cfg, testr.New(t))
			took := time.Since(start)
			if err == nil {
				b.Close()
				t.Fatal("connected")
			}
			t.Logf("%s after %s", err, took.Round(time.Millisecond))
			if !strings.Contains(err.Error(), tc.want) || (tc.is != nil && !errors.Is(err, tc.is)) {
				t.Fatalf("want an error with %q (is %v), got: %v", tc.want, tc.is, err)
			}
			if took > tc.within {
				t.Fatalf("took %s, want under %s", took, tc.within)
			}
			if key := clientKey(t); strings.Contains(err.Error(), key) || strings.Contains(cfg.String(), key) {
				t.Fatal("the key shows in the error or the config's String")
			}
		})
	}
}

// With every OSD stopped (SIGSTOP) a create returns when its ctx ends; once
// the OSDs run again, the abandoned create removes what it made: no orphan
// image, no volume.
func TestCreateWithOSDsStalledReturnsAndLeavesNothing(t *testing.T) {
	b := open(t)
	ctx, thaw := stalled(t)
	start := time.Now()
	_, err := b.Create(ctx, "stalled", 8<<20)
	took := time.Since(start)
	wantErr(t, err, context.DeadlineExceeded)
	if took > 3*time.Second {
		t.Fatalf("create returned after %s with a 2 s ctx", took)
	}
	t.Logf("create with the OSDs stopped: %v after %s", err, took.Round(time.Millisecond))
	thaw()

	deadline := time.Now().Add(90 * time.Second)
	for {
		_, gerr := b.Get(ctxT(t), "stalled")
		imgs := berthImages(t)
		if errors.Is(gerr, backend.ErrNotFound) && len(imgs) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after the OSDs resumed: get %v, images %v", gerr, imgs)
		}
		time.Sleep(500 * time.Millisecond)
	}
	// And the same create now works.
	if _, err := b.Create(ctxT(t), "stalled", 8<<20); err != nil {
		t.Fatal(err)
	}
	if err := b.Delete(ctxT(t), "stalled"); err != nil {
		t.Fatal(err)
	}
}

// stalled stops every OSD (SIGSTOP) until thaw or the test's end, and
// returns a ctx that ends 2 s later.
func stalled(t *testing.T) (context.Context, func()) {
	t.Helper()
	thaw, err := cluster.FreezeOSDs()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(thaw)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	t.Cleanup(cancel)
	return ctx, thaw
}

// A ctx that has already ended makes no call at all.
func TestEndedCtx(t *testing.T) {
	b := open(t)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := b.Create(ctx, "never", 1<<20)
	wantErr(t, err, context.Canceled)
	_, err = b.Capacity(ctx)
	wantErr(t, err, context.Canceled)
	if imgs := berthImages(t); len(imgs) != 0 {
		t.Fatalf("images: %v", imgs)
	}
}
