//go:build ceph

package rbdimage_test

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/berth-io/berth/internal/blockdev/rbdimage"
	"github.com/berth-io/berth/internal/testenv"
	"github.com/berth-io/berth/internal/testenv/testceph"
)

// This package's own test Ceph (folder and ports).
var (
	cluster = testceph.New(testceph.Options{Dir: "/var/lib/berth-ceph-rbdimage-test", Addr: "127.0.0.1",
		MonPort: 3318, PortMin: 7800, PortMax: 7899})
	suite = cluster.Suite("rbd image")
)

func TestMain(m *testing.M) { os.Exit(testenv.Main(m, suite)) }

func ctxT(tb testing.TB) context.Context { return testenv.Context(tb, 3*time.Minute) }

// server opens the image as a node's server would: the nodes' key, an
// access file of its own in dir.
func server(t *testing.T, dir, image string, exclusive bool) (*rbdimage.Image, string) {
	t.Helper()
	key, err := cluster.NodeClientKey()
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "access.json")
	if err := rbdimage.Write(path, rbdimage.Access{MonHost: cluster.MonHost, Client: cluster.NodeClient, Key: key,
		Pool: cluster.Pool, Image: image, Exclusive: exclusive}); err != nil {
		t.Fatal(err)
	}
	img, err := rbdimage.Open(path)
	if err != nil {
		t.Fatalf("open %s: %v", image, err)
	}
	return img, path
}

// TestExclusiveLockRefusesASecondWriter (F14): a server of an exclusive
// image holds its lock in librbd's explicit mode. A second server is
// refused and another client's write fails, where librbd's automatic
// mode would hand the lock over and let both write. Resize and snapshot
// from other clients (the CSI controller) are proxied to the owner and
// still work. A server that takes over breaks only its predecessor's
// lock, never another node's.
func TestExclusiveLockRefusesASecondWriter(t *testing.T) {
	suite.Require(t)
	ctx := ctxT(t)
	const name = "lock-1"
	spec := cluster.Pool + "/" + name
	remove := func() {
		_, _ = cluster.RBD(context.Background(), "snap", "purge", "--no-progress", spec)
		_, _ = cluster.RBD(context.Background(), "rm", "--no-progress", spec)
	}
	remove() // a crashed run's
	if out, err := cluster.RBD(ctx, "create", "--size", "64M", "--image-feature", "layering,exclusive-lock", spec); err != nil {
		t.Fatalf("rbd create: %v: %s", err, out)
	}
	t.Cleanup(remove)
	dir := t.TempDir()

	a, pathA := server(t, filepath.Join(dir, "a"), name, true)
	defer func() { _ = a.Close() }()
	if err := a.Lock(); err != nil {
		t.Fatalf("first server's lock: %v", err)
	}
	data := bytes.Repeat([]byte("a"), 4096)
	if _, err := a.WriteAt(data, 0); err != nil {
		t.Fatalf("owner's write: %v", err)
	}

	b, _ := server(t, filepath.Join(dir, "b"), name, true)
	start := time.Now()
	err := b.Lock()
	if !errors.Is(err, rbdimage.ErrLocked) {
		t.Fatalf("second server's lock: %v, want ErrLocked", err)
	}
	t.Logf("second server refused in %s: %v", time.Since(start).Round(time.Millisecond), err)
	start = time.Now()
	if _, err := b.WriteAt(bytes.Repeat([]byte("b"), 4096), 0); err == nil {
		t.Fatal("a second client wrote while the first holds the lock exclusively")
	} else {
		t.Logf("second client's write failed in %s: %v", time.Since(start).Round(time.Millisecond), err)
	}
	_ = b.Close()

	// The controller's resize and snapshot go through the owner.
	if out, err := cluster.RBD(ctx, "resize", "--no-progress", "--size", "128M", spec); err != nil {
		t.Fatalf("resize while held: %v: %s", err, out)
	}
	if size, err := a.Restat(); err != nil || size != 128<<20 {
		t.Errorf("owner's size after the resize: %d, %v; want 128Mi", size, err)
	}
	if out, err := cluster.RBD(ctx, "snap", "create", spec+"@s1"); err != nil {
		t.Fatalf("snapshot while held: %v: %s", err, out)
	}
	if _, err := a.WriteAt(data, 4096); err != nil {
		t.Fatalf("owner's write after resize and snapshot: %v", err)
	}

	// A hands over cleanly; C takes the image. A server started late on
	// A (a heal that read the Attachment before C took over) breaks only
	// A's old client's lock: C keeps its lock, and the late one is refused.
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	c, _ := server(t, filepath.Join(dir, "c"), name, true)
	defer func() { _ = c.Close() }()
	if err := c.Lock(); err != nil {
		t.Fatalf("third server's lock after the first closed: %v", err)
	}
	late, err := rbdimage.Open(pathA)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = late.Close() }()
	if err := late.TakeOver(); err != nil {
		t.Fatalf("late server's take-over: %v", err)
	}
	if err := late.Lock(); !errors.Is(err, rbdimage.ErrLocked) {
		t.Fatalf("late server's lock: %v, want ErrLocked", err)
	}
	if _, err := c.WriteAt(data, 0); err != nil {
		t.Fatalf("third server's write after the late take-over: %v", err)
	}
	if out, err := cluster.RBD(ctx, "status", spec); err == nil {
		t.Logf("rbd status: %s", strings.TrimSpace(string(out)))
	}

	// A read-only server takes no lock, beside the owner.
	ro, _ := server(t, filepath.Join(dir, "ro"), name, false)
	defer func() { _ = ro.Close() }()
	if err := ro.Lock(); err != nil {
		t.Errorf("read-only server's lock: %v, want none taken", err)
	}
	got := make([]byte, len(data))
	if _, err := ro.ReadAt(got, 0); err != nil || !bytes.Equal(got, data) {
		t.Errorf("read-only server's read: %v (equal %v)", err, bytes.Equal(got, data))
	}
}
