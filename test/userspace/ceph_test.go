//go:build ceph

package userspace

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/apimachinery/pkg/api/resource"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/berth-io/berth/api/v1alpha1"
	"github.com/berth-io/berth/internal/keeper"
	"github.com/berth-io/berth/internal/testenv"
	"github.com/berth-io/berth/internal/testenv/testceph"
)

// This package's own test Ceph (folder and ports apart from the other
// packages'), started by the first test that needs it.
var cephLazy = &testceph.Lazy{Name: "userspace", Options: testceph.Options{Dir: "/var/lib/berth-ceph-userspace-test", Addr: "127.0.0.1",
	MonPort: 3316, PortMin: 7600, PortMax: 7699},
	AtEnd: func(stop func()) { fx.atEnd = append(fx.atEnd, stop) }}

// rbdImage makes an RBD image in c's pool, as the CSI controller does, and
// returns POOL/IMAGE; it is removed when the test ends.
func rbdImage(ctx context.Context, t *testing.T, c *testceph.Cluster, name, size string) string {
	t.Helper()
	spec := c.Pool + "/berth-" + name
	if out, err := c.RBD(ctx, "create", "--size", size, "--image-feature", "layering,exclusive-lock", spec); err != nil {
		t.Fatalf("rbd create %s: %v: %s", spec, err, out)
	}
	t.Cleanup(func() {
		if out, err := c.RBD(context.Background(), "rm", "--no-progress", spec); err != nil {
			t.Errorf("rbd rm %s: %v: %s", spec, err, out)
		}
	})
	return spec
}

// cephSetup is a test's fixture, test Ceph and node client.
func cephSetup(t *testing.T) (*fixture, *testceph.Cluster, csi.NodeClient) {
	t.Helper()
	f := setup(t)
	c := cephLazy.Get(t)
	return f, c, f.node(t)
}

// userspaceCephVolume makes a ceph StorageCluster on c named name, an RBD
// image of mib MiB and its Volume with mounter userspace, and returns the
// Volume, its paths and the secrets kubelet would pass.
func (f *fixture) userspaceCephVolume(ctx context.Context, t *testing.T, c *testceph.Cluster, name string, mib int) (*v1.Volume, mounted, map[string]string) {
	t.Helper()
	f.cephCluster(t, name, c.Monitors, c.Pool)
	size := strconv.Itoa(mib) + "M"
	vol := f.cephVolume(t, name, name, rbdImage(ctx, t, c, name, size), size+"i", v1.MounterUserspace)
	return vol, f.paths(t, name), cephSecrets(t, c)
}

// cephSecrets are what kubelet passes from the class's node-stage secret.
func cephSecrets(t *testing.T, c *testceph.Cluster) map[string]string {
	t.Helper()
	key, err := c.NodeClientKey()
	if err != nil {
		t.Fatal(err)
	}
	return map[string]string{"userID": c.NodeClient, "userKey": key}
}

// accessFile is where the agent keeps a ceph volume's key for its servers.
func (f *fixture) accessFile(volume string) string {
	return filepath.Join(f.dir, "run", "blockdev", "_ceph", volume+".json")
}

// cephLeftNothing is leftNothing plus the volume's key file.
func (f *fixture) cephLeftNothing(t *testing.T, volume string) {
	t.Helper()
	f.leftNothing(t, volume, "")
	if _, err := os.Lstat(f.accessFile(volume)); err == nil {
		t.Errorf("key file %s left", f.accessFile(volume))
	}
}

// writeFiles writes n files of 1 MiB random data under dir, synced, and
// returns their checksums.
func writeFiles(t *testing.T, dir, prefix string, n int) map[string][32]byte {
	t.Helper()
	sums := map[string][32]byte{}
	for i := range n {
		b := make([]byte, 1<<20)
		_, _ = rand.Read(b)
		p := filepath.Join(dir, fmt.Sprintf("%s-%d", prefix, i))
		testenv.WriteSynced(t, p, b)
		sums[p] = sha256.Sum256(b)
	}
	return sums
}

// verifyFiles reads every file back from the device (its page cache
// dropped first) and compares checksums.
func verifyFiles(t *testing.T, sums map[string][32]byte) {
	t.Helper()
	for p, want := range sums {
		fh, err := os.Open(p)
		if err != nil {
			t.Fatal(err)
		}
		_ = unix.Fadvise(int(fh.Fd()), 0, 0, unix.FADV_DONTNEED)
		var buf bytes.Buffer
		_, err = buf.ReadFrom(fh)
		_ = fh.Close()
		if err != nil {
			t.Errorf("read %s: %v", p, err)
		} else if sha256.Sum256(buf.Bytes()) != want {
			t.Errorf("%s: checksum differs", p)
		}
	}
}

// waitServer waits until the keeper lists a live server for volume other
// than dead, and returns its pid.
func (f *fixture) waitServer(t *testing.T, volume string, dead int, within time.Duration) int {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		vols, err := keeper.NewClient(f.keeperSock).List(context.Background())
		if err == nil {
			if i := slices.IndexFunc(vols, func(v keeper.Volume) bool { return v.Name == volume }); i >= 0 &&
				vols[i].ServerPID != 0 && vols[i].ServerPID != dead {
				return vols[i].ServerPID
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no server for %s within %s (keeper: %+v, %v)", volume, within, vols, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// noKeyAnywhere fails when key shows in a process's arguments or in the
// agent's and servers' logs.
func (f *fixture) noKeyAnywhere(t *testing.T, key string) {
	t.Helper()
	cmdlines, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, c := range cmdlines {
		if b, err := os.ReadFile(c); err == nil && bytes.Contains(b, []byte(key)) {
			t.Errorf("the key is in the arguments of process %s", filepath.Base(filepath.Dir(c)))
		}
	}
	logs, _ := filepath.Glob(filepath.Join(f.dir, "run", "blockdev", "*.log"))
	for _, l := range append(logs, f.agentLog) {
		if b, err := os.ReadFile(l); err == nil && bytes.Contains(b, []byte(key)) {
			t.Errorf("the key is in %s", l)
		}
	}
}

// A ceph volume with mounter userspace, staged through the agent's real
// path: a blockdev server serves the RBD image through librbd over FUSE +
// loop, its key reaches it only through a 0600 file. The agent and the
// server are SIGKILLed; the healer starts a server that takes the
// connection over, and every checksum holds; then the server alone; the
// volume grows online; unstage leaves nothing.
func TestCephUserspaceOnRealCeph(t *testing.T) {
	f, c, nc := cephSetup(t)
	ctx := t.Context()
	const name = "ceph-us-1"
	// xfs: it grows online here (ext4 needs CAP_SYS_RESOURCE, and grows at
	// the next stage instead); mkfs.xfs wants 300 MB.
	vol, m, secrets := f.userspaceCephVolume(ctx, t, c, name, 320)
	if err := stageCeph(nc, m, "xfs", secrets); err != nil {
		t.Fatalf("stage: %v", err)
	}
	unstaged := false
	t.Cleanup(func() {
		if !unstaged {
			f.unstage(t, nc, m)
		}
	})
	if _, err := nc.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: name, StagingTargetPath: m.staging,
		TargetPath: m.target, VolumeCapability: mountCapFS("xfs")}); err != nil {
		t.Fatalf("publish: %v", err)
	}
	if st, err := os.Stat(f.accessFile(name)); err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("key file: %v, %v; want 0600", st, err)
	}
	dev := stagedDevice(t, m.staging)
	sums := writeFiles(t, m.target, "before", 4)
	f.noKeyAnywhere(t, secrets["userKey"])

	dead := f.waitServer(t, name, 0, time.Second)
	f.crash(t)
	start := time.Now()
	if err := f.startAgent(); err != nil {
		t.Fatal(err)
	}
	waitCSI(t, nc)
	f.waitServer(t, name, dead, 60*time.Second)
	t.Logf("agent and server killed; the healer started a server in %s", time.Since(start).Round(time.Millisecond))
	verifyFiles(t, sums)
	// A write takes the image's exclusive lock, which the new server broke
	// (else the dead client's would hold it until its watch lapsed).
	start = time.Now()
	after := writeFiles(t, m.target, "after", 2)
	t.Logf("first writes after the heal took %s", time.Since(start).Round(time.Millisecond))
	verifyFiles(t, after)

	// The server alone dies, the agent lives: its periodic pass heals.
	dead = f.waitServer(t, name, 0, time.Second)
	if err := killWait(dead); err != nil {
		t.Fatal(err)
	}
	f.waitServer(t, name, dead, 30*time.Second)
	for p, sum := range writeFiles(t, m.target, "again", 1) {
		after[p] = sum
	}
	verifyFiles(t, sums)
	verifyFiles(t, after)
	f.noKeyAnywhere(t, secrets["userKey"])

	// Online expansion: the controller grows the image, the node the
	// loop device (the server reads the new size from librbd) and xfs.
	before := devSize(t, dev)
	const want = 512 << 20
	if out, err := c.RBD(ctx, "resize", "--no-progress", "--size", "512M", vol.Status.Path); err != nil {
		t.Fatalf("rbd resize: %v: %s", err, out)
	}
	if err := f.env.Client.Get(ctx, client.ObjectKeyFromObject(vol), vol); err != nil {
		t.Fatal(err)
	}
	vol.Status.Capacity = resource.NewQuantity(want, resource.BinarySI)
	if err := f.env.Client.Status().Update(ctx, vol); err != nil {
		t.Fatal(err)
	}
	expandXFS(t, nc, m, dev, before, want)
	verifyFiles(t, sums)

	f.unstage(t, nc, m)
	unstaged = true
	f.cephLeftNothing(t, name)
}

// A key the monitors refuse: a clear error from the server, and nothing
// half made on the node (no connection, loop device, mount, server, key
// file, record, Attachment entry).
func TestCephWrongKeyOnRealCeph(t *testing.T) {
	f, c, nc := cephSetup(t)
	ctx := t.Context()
	const name = "ceph-badkey"
	_, m, secrets := f.userspaceCephVolume(ctx, t, c, name, 64)
	// Another secret of the same form: one letter changed in its middle.
	key := []byte(secrets["userKey"])
	i := len(key) / 2
	key[i] = map[bool]byte{true: 'B', false: 'A'}[key[i] == 'A']
	secrets["userKey"] = string(key)
	start := time.Now()
	err := stageCeph(nc, m, "ext4", secrets)
	if err == nil {
		t.Fatal("stage with a wrong key succeeded")
	}
	t.Logf("refused in %s: %v", time.Since(start).Round(time.Millisecond), err)
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "refused the key") {
		t.Errorf("error %v: want FailedPrecondition saying the key was refused", err)
	}
	if strings.Contains(err.Error(), string(key)) {
		t.Error("the error shows the key")
	}
	f.cephLeftNothing(t, name)
	f.noKeyAnywhere(t, string(key))
}

// cephMounted stages and publishes a new userspace ceph volume of mib MiB
// (ext4); cleanup unpublishes and unstages it.
func (f *fixture) cephMounted(t *testing.T, nc csi.NodeClient, c *testceph.Cluster, name string, mib int) mounted {
	t.Helper()
	_, m, secrets := f.userspaceCephVolume(t.Context(), t, c, name, mib)
	f.stagePublish(t, nc, m, secrets)
	return m
}

// stagePublish stages (ext4) and publishes a ceph volume; cleanup
// unpublishes and unstages it.
func (f *fixture) stagePublish(t *testing.T, nc csi.NodeClient, m mounted, secrets map[string]string) {
	t.Helper()
	if err := stageCeph(nc, m, "ext4", secrets); err != nil {
		t.Fatalf("stage %s: %v", m.name, err)
	}
	t.Cleanup(func() { f.unstage(t, nc, m) })
	if err := retryBusy(func() error {
		_, err := nc.NodePublishVolume(t.Context(), &csi.NodePublishVolumeRequest{VolumeId: m.name, StagingTargetPath: m.staging,
			TargetPath: m.target, VolumeCapability: mountCap()})
		return err
	}); err != nil {
		t.Fatalf("publish %s: %v", m.name, err)
	}
}

// The healer's acceptance test on Ceph-backed userspace volumes: verifying
// writers, BERTH_HEAL_CYCLES (default 50) times the agent and every server
// SIGKILLed and the agent started again, and meanwhile one OSD killed (a
// third of the way) and started again (two thirds): no writer error, no
// read-only remount, every block what was last written.
func TestCephHealUnderWritersOnRealCeph(t *testing.T) {
	f, c, nc := cephSetup(t)
	cycles := envInt("BERTH_HEAL_CYCLES", 50)
	vols := make([]mounted, envInt("BERTH_HEAL_VOLUMES", 2))
	for i := range vols {
		vols[i] = f.cephMounted(t, nc, c, fmt.Sprintf("ceph-heal-%d", i), 64)
	}
	osdDown := false
	t.Cleanup(func() {
		if osdDown {
			_ = c.StartOSD(context.Background(), 0)
		}
	})
	r := f.healUnderWriters(t, vols, cycles, func(cycle int) {
		switch cycle {
		case cycles / 3:
			if err := c.KillOSD(t.Context(), 0); err != nil {
				t.Fatalf("kill OSD 0: %v", err)
			}
			osdDown = true
			t.Logf("cycle %d: OSD 0 killed", cycle)
		case 2 * cycles / 3:
			if err := c.StartOSD(t.Context(), 0); err != nil {
				t.Fatalf("start OSD 0: %v", err)
			}
			osdDown = false
			t.Logf("cycle %d: OSD 0 started again", cycle)
		}
	})
	if len(r.samples) > 0 {
		t.Logf("ceph heal: cycles=%d volumes=%d samples=%d p50=%s p99=%s max=%s writes=%d verified=%d errors=%d",
			cycles, len(vols), len(r.samples), r.pct(0.5).Round(time.Millisecond), r.pct(0.99).Round(time.Millisecond),
			r.pct(1).Round(time.Millisecond), r.writes, r.verified, r.errors)
	}
	if err := c.WaitHealthy(t.Context()); err != nil {
		t.Errorf("Ceph not healthy again: %v", err)
	}
}
