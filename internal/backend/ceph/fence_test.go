//go:build ceph

package ceph_test

import (
	"bytes"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ceph/go-ceph/rados"
	rbdlib "github.com/ceph/go-ceph/rbd"
	"github.com/go-logr/logr/testr"

	"github.com/berth-io/berth/internal/backend/ceph"
	"github.com/berth-io/berth/internal/backend/ceph/cephaddr"
)

// nodeClient is a Ceph client standing for one node's blockdev server:
// its own connection, the volume's image open read-write.
type nodeClient struct {
	conn *rados.Conn
	img  *rbdlib.Image
}

func connectNode(t *testing.T, client, key, image string) *nodeClient {
	t.Helper()
	conn, err := rados.NewConnWithUser(client)
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range [][2]string{
		{"mon_host", cluster.MonHost}, {"key", key},
		{"client_mount_timeout", "10"}, {"rados_osd_op_timeout", "20"}, {"rados_mon_op_timeout", "20"},
		{"log_to_stderr", "false"}, {"err_to_stderr", "false"},
	} {
		if err := conn.SetConfigOption(o[0], o[1]); err != nil {
			t.Fatal(err)
		}
	}
	if err := conn.Connect(); err != nil {
		conn.Shutdown()
		t.Fatalf("connect: %v", err)
	}
	ioctx, err := conn.OpenIOContext(cluster.Pool)
	if err != nil {
		t.Fatal(err)
	}
	img, err := rbdlib.OpenImage(ioctx, image, rbdlib.NoSnapshot)
	if err != nil {
		t.Fatalf("open image %s: %v", image, err)
	}
	n := &nodeClient{conn: conn, img: img}
	t.Cleanup(func() {
		// A blocklisted client's close may fail; the test's end is what
		// matters.
		_ = img.Close()
		ioctx.Destroy()
		conn.Shutdown()
	})
	return n
}

func (n *nodeClient) write(b []byte, off int64) error {
	_, err := n.img.WriteAt(b, off)
	if err == nil {
		err = n.img.Flush()
	}
	return err
}

func keyOf(t *testing.T, keyring string) string {
	t.Helper()
	b, err := os.ReadFile(keyring)
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(strings.TrimSpace(l), "="); ok && strings.TrimSpace(k) == "key" {
			return strings.TrimSpace(v)
		}
	}
	t.Fatalf("no key in %s", keyring)
	return ""
}

// TestFencingOnRealCeph: node A writes; A's client is blocklisted (and its
// lock broken) → A's next write fails, B takes the lock and writes, A's data
// up to the fence is intact; taken off the blocklist, a new client of A
// works again.
func TestFencingOnRealCeph(t *testing.T) {
	b := open(t)
	ctx := ctxT(t)
	const id = "fence-a-b"
	if _, err := b.Create(ctx, id, 8<<20); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Delete(ctxT(t), id) })
	image := "berth-" + id
	key := clientKey(t)

	a := connectNode(t, cluster.Client, key, image)
	dataA := bytes.Repeat([]byte("A"), 4096)
	if err := a.write(dataA, 0); err != nil {
		t.Fatalf("A writes: %v", err)
	}
	if owner, err := a.img.LockIsExclusiveOwner(); err != nil || !owner {
		t.Fatalf("A owns the exclusive lock: %v, %v", owner, err)
	}
	addrsA, err := cephaddr.Client(a.conn)
	if err != nil || len(addrsA) == 0 {
		t.Fatalf("cephaddr.Client: %v, %v", addrsA, err)
	}
	t.Logf("node A's client: %v", addrsA)

	start := time.Now()
	if err := b.FenceClients(ctx, id, addrsA); err != nil {
		t.Fatalf("FenceClients: %v", err)
	}
	t.Logf("fenced in %s", time.Since(start).Round(time.Millisecond))
	listed, err := b.Blocklisted(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, addr := range addrsA {
		if !slices.Contains(listed, addr) {
			t.Errorf("%s not on the blocklist %v", addr, listed)
		}
	}
	// Twice is no error (a retried lock breaking).
	if err := b.FenceClients(ctx, id, addrsA); err != nil {
		t.Fatalf("FenceClients again: %v", err)
	}

	start = time.Now()
	if err := a.write(bytes.Repeat([]byte("a"), 4096), 4096); err == nil {
		t.Fatal("A's write after the fence succeeded")
	} else {
		t.Logf("A's write after the fence: %v (%s)", err, time.Since(start).Round(time.Millisecond))
	}

	bc := connectNode(t, cluster.Client, key, image)
	dataB := bytes.Repeat([]byte("B"), 4096)
	start = time.Now()
	if err := bc.write(dataB, 8192); err != nil {
		t.Fatalf("B writes: %v", err)
	}
	t.Logf("B's first write (takes the lock): %s", time.Since(start).Round(time.Millisecond))
	got := make([]byte, 3*4096)
	if _, err := bc.img.ReadAt(got, 0); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got[:4096], dataA) {
		t.Error("A's data before the fence is not intact")
	}
	if !bytes.Equal(got[4096:8192], make([]byte, 4096)) {
		t.Error("A's write after the fence reached the image")
	}
	if !bytes.Equal(got[8192:], dataB) {
		t.Error("B's data is not there")
	}

	// hack/ceph gives client.berth `allow command "osd blocklist"` beside
	// profile rbd (which may only add), so that the operator's Unfencer,
	// which has only the cluster's Secret, can lift entries.
	if err := b.UnfenceClients(ctx, addrsA); err != nil {
		t.Fatalf("UnfenceClients as client.berth: %v", err)
	}
	admin, err := ceph.New(ctx, ceph.Config{Monitors: cluster.MonHost, Pool: cluster.Pool, Client: "admin",
		Key: keyOf(t, cluster.AdminKeyring), ConnectTimeout: 5 * time.Second, OpTimeout: 20 * time.Second}, testr.New(t))
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	if err := admin.UnfenceClients(ctx, addrsA); err != nil {
		t.Fatalf("UnfenceClients again (an address no longer listed): %v", err)
	}
	if listed, err = b.Blocklisted(ctx); err != nil {
		t.Fatal(err)
	}
	for _, addr := range addrsA {
		if slices.Contains(listed, addr) {
			t.Errorf("%s still on the blocklist", addr)
		}
	}
	if err := bc.img.Close(); err != nil {
		t.Fatal(err)
	}
	a2 := connectNode(t, cluster.Client, key, image)
	if err := a2.write(dataA, 4096); err != nil {
		t.Fatalf("a new client of node A writes: %v", err)
	}
}
