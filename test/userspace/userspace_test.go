package userspace

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/moby/sys/mountinfo"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1 "github.com/berth-io/berth/api/v1alpha1"
	"github.com/berth-io/berth/internal/testenv"
)

func setup(t *testing.T) *fixture {
	t.Helper()
	suite.Require(t)
	return &fx
}

func mountCap() *csi.VolumeCapability { return mountCapFS("ext4") }

func mountCapFS(fsType string) *csi.VolumeCapability {
	return &csi.VolumeCapability{
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
		AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{FsType: fsType}},
	}
}

// waitCSI waits until the agent's CSI node service answers.
func waitCSI(t *testing.T, nc csi.NodeClient) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		_, err := nc.NodeGetInfo(ctx, &csi.NodeGetInfoRequest{})
		cancel()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("CSI node service does not answer: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// mounted is one userspace volume staged and published by the test.
type mounted struct {
	name, staging, target string
}

// userspaceVolume makes a Volume with mounter userspace, waits until the
// agent made its image, stages and publishes it. Cleanup undoes all that.
func (f *fixture) userspaceVolume(t *testing.T, nc csi.NodeClient, name string) mounted {
	t.Helper()
	return f.userspaceVolumeFS(t, nc, name, "ext4", "128Mi")
}

// userspaceVolumeFS is userspaceVolume with a filesystem of fsType and
// the given size.
func (f *fixture) userspaceVolumeFS(t *testing.T, nc csi.NodeClient, name, fsType, size string) mounted {
	t.Helper()
	f.newVolume(t, name, fsType, size, v1.MounterUserspace)
	m := f.paths(t, name)
	if err := retryBusy(func() error {
		_, err := nc.NodeStageVolume(context.Background(), &csi.NodeStageVolumeRequest{VolumeId: name, StagingTargetPath: m.staging, VolumeCapability: mountCapFS(fsType)})
		return err
	}); err != nil {
		t.Fatalf("stage %s: %v", name, err)
	}
	// Unpublish and unstage through the agent, as kubelet does.
	t.Cleanup(func() { f.unstage(t, nc, m) })
	if err := retryBusy(func() error {
		_, err := nc.NodePublishVolume(context.Background(), &csi.NodePublishVolumeRequest{VolumeId: name, StagingTargetPath: m.staging,
			TargetPath: m.target, VolumeCapability: mountCapFS(fsType)})
		return err
	}); err != nil {
		t.Fatalf("publish %s: %v", name, err)
	}
	return m
}

// newVolume makes a Volume of this node and waits until the agent made its
// image; cleanup deletes it and waits until the agent deleted it. It
// returns the Volume as made (status.path is its image).
func (f *fixture) newVolume(t *testing.T, name, fsType, size string, mounter v1.Mounter) *v1.Volume {
	t.Helper()
	vol := volumeObject(name, fsType, size, mounter)
	f.env.AgentVolume(t, vol)
	return vol
}

// volumeObject is a ReadWriteOnce Volume of this node in cluster c1, not
// yet made.
func volumeObject(name, fsType, size string, mounter v1.Mounter) *v1.Volume {
	return &v1.Volume{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{v1.NodeLabel: node}},
		Spec: v1.VolumeSpec{StorageCluster: "c1", Size: resource.MustParse(size), AccessMode: v1.ReadWriteOnce,
			FSType: fsType, Node: node, Mounter: mounter},
	}
}

// paths are kubelet's staging path and a pod's target path of a volume,
// their parent folders made as kubelet makes them.
func (f *fixture) paths(t *testing.T, name string) mounted {
	t.Helper()
	m := mounted{name: name, staging: f.stagingPath(name), target: filepath.Join(f.kubeletRoot(), "pods", name, "volumes", "kubernetes.io~csi", name, "mount")}
	for _, dir := range []string{m.staging, filepath.Dir(m.target)} {
		if err := os.MkdirAll(dir, 0o750); err != nil {
			t.Fatal(err)
		}
	}
	return m
}

// unstage unpublishes and unstages m through the agent, as kubelet does.
func (f *fixture) unstage(t *testing.T, nc csi.NodeClient, m mounted) {
	t.Helper()
	ctx := context.Background()
	waitCSI(t, nc)
	if err := retryBusy(func() error {
		_, err := nc.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: m.name, TargetPath: m.target})
		return err
	}); err != nil {
		t.Errorf("unpublish %s: %v", m.name, err)
	}
	if err := retryBusy(func() error {
		_, err := nc.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: m.name, StagingTargetPath: m.staging})
		return err
	}); err != nil {
		t.Errorf("unstage %s: %v", m.name, err)
	}
}

// retryBusy retries call while the agent answers Aborted (the volume is
// busy, e.g. being healed), as kubelet does.
func retryBusy(call func() error) error {
	deadline := time.Now().Add(30 * time.Second)
	for {
		err := call()
		if status.Code(err) != codes.Aborted || time.Now().After(deadline) {
			return err
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v >= 0 {
		return v
	}
	return def
}

// TestHealUnderWriters is the acceptance test of the healer: verifying
// writers on 5 userspace volumes, and BERTH_HEAL_CYCLES (default 50) times
// the agent and every blockdev server SIGKILLed and the agent started again.
// No writer may see an error, no file system may turn read-only, and every
// block must hold what was last written to it.
func TestHealUnderWriters(t *testing.T) {
	f := setup(t)
	cycles := envInt("BERTH_HEAL_CYCLES", 50)
	nvol := envInt("BERTH_HEAL_VOLUMES", 5)
	nc := f.node(t)
	vols := make([]mounted, nvol)
	for i := range vols {
		vols[i] = f.userspaceVolume(t, nc, fmt.Sprintf("heal-%d", i))
	}
	r := f.healUnderWriters(t, vols, cycles, nil)
	if len(r.samples) > 0 {
		// One line for hack/bench.sh to pick up.
		passthrough := os.Getenv("BERTH_BLOCKDEV_PASSTHROUGH")
		if passthrough == "" {
			passthrough = "default"
		}
		fmt.Printf("HEAL_RESULT cycles=%d volumes=%d passthrough=%s samples=%d p50=%s p99=%s max=%s writes=%d verified=%d errors=%d\n",
			cycles, nvol, passthrough, len(r.samples), r.pct(0.5).Round(time.Millisecond), r.pct(0.99).Round(time.Millisecond),
			r.pct(1).Round(time.Millisecond), r.writes, r.verified, r.errors)
	}
}

// healed is what healUnderWriters saw: each volume's time from the agent's
// start to its first write, sorted; writes and verified reads; errors.
type healed struct {
	samples                  []time.Duration
	writes, verified, errors int64
}

// pct is the p-th fraction of the samples (there is at least one).
func (h healed) pct(p float64) time.Duration {
	return h.samples[int(p*float64(len(h.samples)-1)+0.5)]
}

// healUnderWriters runs a verifying writer on each of vols and, cycles
// times, SIGKILLs the agent and every blockdev server and starts the agent
// again; during, when set, runs before each cycle's kill. It fails the test
// on any writer error, read-only or I/O error in the kernel log.
func (f *fixture) healUnderWriters(t *testing.T, vols []mounted, cycles int, during func(cycle int)) healed {
	t.Helper()
	writers := make([]*writer, len(vols))
	klogStart := len(testenv.KernelLog(t))
	for i, m := range vols {
		w := startWriter(t, m, uint64(i+1))
		writers[i] = w
		t.Cleanup(func() {
			if w.stop != nil {
				select {
				case <-w.stop:
				default:
					_ = w.Stop(30 * time.Second)
				}
			}
		})
	}
	var samples []time.Duration
	for c := 0; c < cycles; c++ {
		if during != nil {
			during(c)
		}
		time.Sleep(300 * time.Millisecond)
		for i, w := range writers {
			if errs := w.Errors(); len(errs) > 0 {
				t.Fatalf("cycle %d: writer on %s: %v", c, vols[i].name, errs)
			}
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		err := f.killAll(ctx)
		cancel()
		if err != nil {
			t.Fatalf("cycle %d: kill: %v", c, err)
		}
		start := time.Now()
		for _, w := range writers {
			w.Mark(start)
		}
		if err := f.startAgent(); err != nil {
			t.Fatal(err)
		}
		// Each volume's own time to its first write after the start (not
		// when this loop gets to it: writers go on writing meanwhile).
		for i, w := range writers {
			for w.resumedAfter(start.UnixNano()) == 0 {
				if time.Since(start) > 60*time.Second {
					t.Fatalf("cycle %d: no write finished on %s within 60s of the agent start (errors: %v)", c, vols[i].name, w.Errors())
				}
				time.Sleep(5 * time.Millisecond)
			}
			samples = append(samples, time.Duration(w.resumedAfter(start.UnixNano())-start.UnixNano()))
		}
	}
	var total, verified int64
	// All stop at once, then each is verified: verifying one while the
	// others still wrote took minutes with 100 volumes.
	for _, w := range writers {
		w.halt()
	}
	for i, w := range writers {
		if err := w.Stop(60 * time.Second); err != nil {
			t.Errorf("writer on %s: %v", vols[i].name, err)
		}
		total += w.writes.Load()
		verified += w.verified.Load()
	}
	devs := checkReadWrite(t, vols)
	for _, l := range testenv.KernelLog(t)[min(klogStart, len(testenv.KernelLog(t))):] {
		for _, d := range devs {
			if strings.Contains(l, d+":") || strings.Contains(l, d+")") || strings.Contains(l, d+",") || strings.Contains(l, d+" ") {
				if strings.Contains(l, "error") || strings.Contains(l, "read-only") {
					t.Errorf("kernel log: %s", l)
				}
			}
		}
	}
	slices.Sort(samples)
	return healed{samples: samples, writes: total, verified: verified, errors: int64(countErrors(writers))}
}

func countErrors(ws []*writer) int {
	n := 0
	for _, w := range ws {
		n += len(w.Errors())
	}
	return n
}

// checkReadWrite fails when a volume's file system was remounted read-only
// (the superblock options say ro while the mount says rw). It returns the
// volumes' devices by kernel name (loopN).
func checkReadWrite(t *testing.T, vols []mounted) []string {
	t.Helper()
	ms, err := mountinfo.GetMounts(nil)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	var devs []string
	for _, mi := range ms {
		for _, m := range vols {
			if mi.Mountpoint != m.staging && mi.Mountpoint != m.target {
				continue
			}
			seen[mi.Mountpoint] = true
			if mi.Mountpoint == m.staging {
				devs = append(devs, filepath.Base(mi.Source))
			}
			if slices.Contains(strings.Split(mi.VFSOptions, ","), "ro") {
				t.Errorf("%s is read-only: %+v", mi.Mountpoint, *mi)
			}
		}
	}
	for _, m := range vols {
		if !seen[m.staging] || !seen[m.target] {
			t.Errorf("volume %s: staging or target mount missing", m.name)
		}
	}
	return devs
}
