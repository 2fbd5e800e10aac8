//go:build ceph

package userspace

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/record"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/berth-io/berth/api/v1alpha1"
	"github.com/berth-io/berth/internal/backend/ceph"
	"github.com/berth-io/berth/internal/fence"
	"github.com/berth-io/berth/internal/testenv/testceph"
)

// recordedClients are the Ceph clients the Attachment of volume records
// for this fixture's node (node A).
func (f *fixture) recordedClients(t *testing.T, volume string) []string {
	t.Helper()
	var att v1.Attachment
	if err := f.env.Client.Get(t.Context(), client.ObjectKey{Name: volume}, &att); err != nil {
		t.Fatal(err)
	}
	for _, n := range att.Status.Nodes {
		if n.Node == node {
			return n.CephClients
		}
	}
	return nil
}

// watchers are the client addresses watching an RBD image (its open
// clients), as Ceph itself says.
func watchers(t *testing.T, c *testceph.Cluster, spec string) []string {
	t.Helper()
	out, err := c.RBD(t.Context(), "status", "--format", "json", spec)
	if err != nil {
		t.Fatalf("rbd status %s: %v: %s", spec, err, out)
	}
	var st struct {
		Watchers []struct {
			Address string `json:"address"`
		} `json:"watchers"`
	}
	if err := json.Unmarshal(out, &st); err != nil {
		t.Fatalf("rbd status %s: %v: %s", spec, err, out)
	}
	var addrs []string
	for _, w := range st.Watchers {
		addrs = append(addrs, strings.TrimPrefix(w.Address, "v1:"))
	}
	return addrs
}

// servedBy fails unless the recorded addresses name a client that has the
// image open.
func servedBy(t *testing.T, recorded, watching []string) {
	t.Helper()
	if len(recorded) == 0 || !slices.ContainsFunc(recorded, func(a string) bool { return slices.Contains(watching, a) }) {
		t.Fatalf("recorded ceph clients %v; the image's watchers are %v", recorded, watching)
	}
}

// The Ceph fencing of the data path, on real parts: a ceph volume staged
// on node A records A's server's client address in the Attachment; a heal
// records the new server's; a fencer standing for node B (A tainted
// out-of-service) blocklists A's client before B holds the volume; A's
// writes then fail (never a silent success) and B reads what A synced;
// node A back: its cleaner undoes the stale stage with its client
// blocklisted and starts no new client; the Unfencer then takes A's client
// off the blocklist with the berth client's caps.
func TestCephFencingOnRealCeph(t *testing.T) {
	f, c, nc := cephSetup(t)
	ctx := t.Context()
	const name = "ceph-fence-1"
	m := f.cephMounted(t, nc, c, name, 64)
	spec := c.Pool + "/berth-" + name

	first := f.recordedClients(t, name)
	servedBy(t, first, watchers(t, c, spec))
	t.Logf("node A's server recorded as %v", first)

	// The server dies, the agent's periodic pass heals: a new client,
	// and the record follows it (a stale one would fence the dead client).
	dead := f.waitServer(t, name, 0, time.Second)
	if err := killWait(dead); err != nil {
		t.Fatal(err)
	}
	f.waitServer(t, name, dead, 30*time.Second)
	var healed []string
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		if healed = f.recordedClients(t, name); len(healed) > 0 && !slices.Equal(healed, first) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after the heal the Attachment still records %v", healed)
		}
	}
	servedBy(t, healed, watchers(t, c, spec))
	t.Logf("after the heal: %v", healed)
	sums := writeFiles(t, m.target, "a", 3)
	devA := mountSource(m.staging)

	// Node A is lost: tainted out-of-service. A Fencer standing for node
	// B fences with the berth client, as the operator does.
	taint(t, f, corev1.Taint{Key: corev1.TaintNodeOutOfService, Value: "nodeshutdown", Effect: corev1.TaintEffectNoExecute})
	key, err := c.ClientKey()
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := ceph.ConfigFor(ctx, &v1.CephSpec{Monitors: []v1.CephMonitor{v1.CephMonitor(c.Monitors)}, Pool: c.Pool}, c.Client, key, nil)
	if err != nil {
		t.Fatal(err)
	}
	store, err := ceph.Open(ctx, cfg, testr.New(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(store.Close) // after the unfencing below
	fencing := store.(interface {
		fence.Blocklister
		Blocklisted(context.Context) ([]string, error)
	})
	t.Cleanup(func() { _ = fencing.UnfenceClients(context.Background(), healed) })
	const nodeB = "us-node-b"
	stagingB := filepath.Join(f.dir, "node-b", name)
	fb := fence.New(f.env.Client, record.NewFakeRecorder(100), clock.RealClock{}, testr.New(t), fence.Options{Blocklister: fencing})
	start := time.Now()
	if err := fb.Acquire(ctx, fence.Request{Volume: name, Node: nodeB, MountDir: stagingB, StagingPath: stagingB,
		AccessMode: v1.ReadWriteOnce}); err != nil {
		t.Fatalf("node B's stage: %v", err)
	}
	t.Cleanup(func() { _ = fb.Release(context.Background(), name, nodeB, stagingB) })
	t.Logf("node B holds the volume after %s", time.Since(start).Round(time.Millisecond))
	listed, err := fencing.Blocklisted(ctx)
	if missing := slices.DeleteFunc(slices.Clone(healed), func(a string) bool { return slices.Contains(listed, a) }); err != nil || len(missing) > 0 {
		t.Errorf("node A's clients %v are not on the blocklist %v (%v) after B took the volume", missing, listed, err)
	}
	var nc0 v1.NodeCleanup
	if err := f.env.Client.Get(ctx, client.ObjectKey{Name: node}, &nc0); err != nil {
		t.Fatal(err)
	}
	if len(nc0.Spec.Blocklisted) != len(healed) {
		t.Errorf("node A's NodeCleanup records blocklisted %+v; want %v", nc0.Spec.Blocklisted, healed)
	}

	// A writer left on node A gets an error, never a silent success.
	werr := make(chan error, 1)
	go func() {
		p := filepath.Join(m.target, "after-fence")
		fh, err := os.OpenFile(p, os.O_CREATE|os.O_WRONLY, 0o600)
		if err == nil {
			_, err = fh.Write(make([]byte, 1<<20))
			if err == nil {
				err = fh.Sync()
			}
			_ = fh.Close()
		}
		werr <- err
	}()
	select {
	case err := <-werr:
		if err == nil {
			t.Fatal("node A wrote and synced after its client was blocklisted")
		}
		t.Logf("node A's write after the fence: %v", err)
	case <-time.After(90 * time.Second):
		t.Fatal("node A's write neither failed nor succeeded within 90s")
	}

	// Node B reads what A synced: the image exported by B's client, its
	// file system (journal replayed on the copy) mounted.
	img := filepath.Join(f.dir, name+".img")
	t.Cleanup(func() { _ = os.Remove(img) })
	if out, err := c.RBD(ctx, "export", "--no-progress", spec, img); err != nil {
		t.Fatalf("rbd export: %v: %s", err, out)
	}
	mnt := filepath.Join(f.dir, "node-b-mnt")
	if err := os.MkdirAll(mnt, 0o700); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("mount", "-o", "loop", img, mnt).CombinedOutput(); err != nil {
		t.Fatalf("mount B's copy: %v: %s", err, out)
	}
	t.Cleanup(func() { _ = exec.Command("umount", mnt).Run() })
	moved := map[string][32]byte{}
	for p, sum := range sums {
		moved[filepath.Join(mnt, filepath.Base(p))] = sum
	}
	verifyFiles(t, moved)

	// Node A comes back (its agent and servers were gone): its cleaner
	// undoes the stale stage while its client is blocklisted, and starts no
	// server for it (a new, unfenced client would take the lock from B).
	f.crash(t)
	startsBefore := f.serverStarts(t, name)
	untaint(t, f, corev1.TaintNodeOutOfService)
	nodeReady(t, f)
	if err := f.startAgent(); err != nil {
		t.Fatal(err)
	}
	waitCSI(t, nc)
	for deadline := time.Now().Add(90 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		var ncA v1.NodeCleanup
		if err := f.env.Client.Get(ctx, client.ObjectKey{Name: node}, &ncA); err != nil {
			t.Fatal(err)
		}
		if len(ncA.Spec.Entries) == 0 && ncA.Status.LastProcessed != nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("node A's cleaner left %+v (status %+v)", ncA.Spec.Entries, ncA.Status)
		}
	}
	if dev := mountSource(m.staging); dev != "" {
		t.Errorf("node A's staging still holds %s after its cleaner ran", dev)
	}
	// Cutting the connection took the backing file away; the loop device
	// must go too, not stay bound to a file nothing can reach.
	if b, err := os.ReadFile(filepath.Join("/sys/block", filepath.Base(devA), "loop", "backing_file")); err == nil {
		t.Errorf("node A's loop device %s is still bound to %q after its cleaner ran", devA, strings.TrimSpace(string(b)))
	}
	if n := f.serverStarts(t, name) - startsBefore; n != 0 {
		t.Errorf("node A started %d server(s), new Ceph clients, for a volume whose lock B took", n)
	}
	if w := watchers(t, c, spec); len(w) != 0 {
		t.Errorf("after node A was cleaned, clients still have the image open: %v", w)
	}

	// The Unfencer (short cool-down) takes A's client off the blocklist,
	// as the same berth client (its caps).
	un := fence.NewUnfencer(f.env.Client, fencing, record.NewFakeRecorder(100), clock.RealClock{}, testr.New(t),
		fence.UnfenceOptions{Cooldown: 100 * time.Millisecond})
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		_, err := un.RunOnce(ctx)
		listed, lerr := fencing.Blocklisted(ctx)
		if err == nil && lerr == nil && !slices.ContainsFunc(healed, func(a string) bool { return slices.Contains(listed, a) }) {
			break
		}
		if time.Now().After(deadline) {
			caps, _ := c.AdminCeph(ctx, "auth", "get", "client."+c.Client)
			t.Fatalf("node A's clients %v still blocklisted (%v): unfence: %v, %v (caps: %s)", healed, listed, err, lerr, capsOnly(caps))
		}
	}
}

// untaint takes the taint key off node A.
func untaint(t *testing.T, f *fixture, key string) {
	t.Helper()
	var n corev1.Node
	if err := f.env.Client.Get(t.Context(), client.ObjectKey{Name: node}, &n); err != nil {
		t.Fatal(err)
	}
	n.Spec.Taints = slices.DeleteFunc(n.Spec.Taints, func(x corev1.Taint) bool { return x.Key == key })
	if err := f.env.Client.Update(t.Context(), &n); err != nil {
		t.Fatal(err)
	}
}

// nodeReady marks node A Ready, as its kubelet would when it is back.
func nodeReady(t *testing.T, f *fixture) {
	t.Helper()
	var n corev1.Node
	if err := f.env.Client.Get(t.Context(), client.ObjectKey{Name: node}, &n); err != nil {
		t.Fatal(err)
	}
	n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue,
		LastHeartbeatTime: metav1.Now(), LastTransitionTime: metav1.Now()}}
	if err := f.env.Client.Status().Update(t.Context(), &n); err != nil {
		t.Fatal(err)
	}
}

// taint adds tn to node A's Node; cleanup removes it.
func taint(t *testing.T, f *fixture, tn corev1.Taint) {
	t.Helper()
	edit := func(ctx context.Context, fn func(n *corev1.Node)) error {
		var n corev1.Node
		if err := f.env.Client.Get(ctx, client.ObjectKey{Name: node}, &n); err != nil {
			return err
		}
		fn(&n)
		return f.env.Client.Update(ctx, &n)
	}
	if err := edit(t.Context(), func(n *corev1.Node) { n.Spec.Taints = append(n.Spec.Taints, tn) }); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		err := edit(context.Background(), func(n *corev1.Node) {
			n.Spec.Taints = slices.DeleteFunc(n.Spec.Taints, func(x corev1.Taint) bool { return x.Key == tn.Key })
		})
		if err != nil && !errors.Is(err, context.Canceled) {
			t.Errorf("untaint node %s: %v", node, err)
		}
	})
}

// capsOnly is `ceph auth get`'s output without the key.
func capsOnly(out []byte) string {
	var caps []string
	for _, l := range strings.Split(string(out), "\n") {
		if strings.Contains(l, "caps") {
			caps = append(caps, strings.TrimSpace(l))
		}
	}
	return strings.Join(caps, "; ")
}

// serverStarts counts the agent's log lines saying it started a server
// for volume.
func (f *fixture) serverStarts(t *testing.T, volume string) int {
	t.Helper()
	b, err := os.ReadFile(f.agentLog)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, l := range strings.Split(string(b), "\n") {
		if strings.Contains(l, "blockdev server started") && strings.Contains(l, `"`+volume+`"`) {
			n++
		}
	}
	return n
}
