//go:build ceph

package userspace

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/mount-utils"

	v1 "github.com/berth-io/berth/api/v1alpha1"
	"github.com/berth-io/berth/internal/keeper"
	"github.com/berth-io/berth/internal/testenv/testceph"
)

// cephWorkload is one row of the ceph bench: the same I/O for rbd bench
// (rbd's pattern) and for fio on a block device.
type cephWorkload struct {
	label, fioRW, rbdType, rbdPattern string
	bs                                int // bytes
	depth                             int
}

var cephWorkloads = []cephWorkload{
	{"4k randread QD64", "randread", "read", "rand", 4 << 10, 64},
	{"4k randwrite QD64", "randwrite", "write", "rand", 4 << 10, 64},
	{"128k read QD16", "read", "read", "seq", 128 << 10, 16},
	{"128k write QD16", "write", "write", "seq", 128 << 10, 16},
}

// unit is what a row reports: IOPS for small blocks, MiB/s for large.
func (w cephWorkload) unit() string {
	if w.bs <= 4<<10 {
		return "IOPS"
	}
	return "MiB/s"
}

// figure turns operations per second into the row's unit.
func (w cephWorkload) figure(opsPerSec float64) float64 {
	if w.unit() == "IOPS" {
		return opsPerSec
	}
	return opsPerSec * float64(w.bs) / (1 << 20)
}

// TestCephBench is `make bench`'s Ceph section (hack/bench-ceph.sh), not a
// test: on one test Ceph and one RBD image of its pool it measures rbd
// bench (librbd alone, the engine's limit here), rbd-fuse + loop (what a
// user would otherwise use on this kernel) and a berth userspace ceph
// volume staged through the agent (blockdev server on librbd, FUSE +
// loop), with the same fio jobs on both block devices, and prints one
// CEPH_BENCH_RESULT line per workload. Nothing is asserted about the
// figures. Runs only with BERTH_CEPH_BENCH=1.
// Env: BENCH_SECONDS (fio seconds per job, default 10), BENCH_CEPH_MIB
// (image size, default 1024), BENCH_CEPH_RBD_4K_MIB (bytes each 4k rbd
// bench moves, default 128).
func TestCephBench(t *testing.T) {
	if os.Getenv("BERTH_CEPH_BENCH") != "1" {
		t.Skip("a benchmark: BERTH_CEPH_BENCH=1 (hack/bench-ceph.sh) runs it")
	}
	f, c, nc := cephSetup(t)
	ctx := t.Context()
	const name = "ceph-bench"
	mib := envInt("BENCH_CEPH_MIB", 1024)
	seconds := envInt("BENCH_SECONDS", 10)
	f.cephCluster(t, name, c.Monitors, c.Pool)
	spec := rbdImage(ctx, t, c, name, strconv.Itoa(mib)+"M")
	// Every block written once, so that reads hit objects, not holes.
	if out, err := c.RBD(ctx, "bench", "--io-type", "write", "--io-pattern", "seq", "--io-size", "4M",
		"--io-threads", "16", "--io-total", strconv.Itoa(mib)+"M", spec); err != nil {
		t.Fatalf("fill %s: %v: %s", spec, err, out)
	}

	// rbd bench as it comes (librbd's cache on, policy writearound: a
	// write is acknowledged before it is in Ceph) and, for writes, with the
	// cache off, as berth's servers run librbd (a write acknowledged to the
	// kernel must survive a SIGKILLed server): the engine's limit for writes
	// of the same durability.
	rbdBench, rbdNoCache := map[string]float64{}, map[string]float64{}
	for _, w := range cephWorkloads {
		total := int64(mib) << 20
		if w.bs <= 4<<10 {
			total = int64(envInt("BENCH_CEPH_RBD_4K_MIB", 128)) << 20
		}
		ops, err := rbdBenchOps(ctx, c, spec, w, total)
		if err != nil {
			t.Fatal(err)
		}
		rbdBench[w.label] = w.figure(ops)
		t.Logf("rbd bench %s: %.0f %s", w.label, rbdBench[w.label], w.unit())
		if w.rbdType != "write" {
			continue
		}
		if ops, err = rbdBenchOps(ctx, c, spec, w, total, "--rbd_cache=false"); err != nil {
			t.Fatal(err)
		}
		rbdNoCache[w.label] = w.figure(ops)
		t.Logf("rbd bench --rbd_cache=false %s: %.0f %s", w.label, rbdNoCache[w.label], w.unit())
	}

	// rbd-fuse as it comes (librbd's cache on, as for rbd bench) and, for
	// writes, with the cache off: berth's durability.
	fuse, fuseNoCache := map[string]float64{}, map[string]float64{}
	withRBDFuse(t, c, spec, nil, func(dev string, pid int) {
		for _, w := range cephWorkloads {
			fuse[w.label] = w.figure(fioCPU(t, "rbd-fuse", pid, dev, w, seconds))
			t.Logf("rbd-fuse %s: %.0f %s", w.label, fuse[w.label], w.unit())
		}
	})
	withRBDFuse(t, c, spec, []string{"--rbd_cache=false"}, func(dev string, pid int) {
		for _, w := range cephWorkloads {
			if w.rbdType == "write" {
				fuseNoCache[w.label] = w.figure(fioCPU(t, "rbd-fuse/nc", pid, dev, w, seconds))
				t.Logf("rbd-fuse --rbd_cache=false %s: %.0f %s", w.label, fuseNoCache[w.label], w.unit())
			}
		}
	})

	berth := map[string]float64{}
	dev := f.stageCephBlock(t, nc, c, name, spec, mib)
	server := serverPID(t, keeper.NewClient(f.keeperSock), name)
	for _, w := range cephWorkloads {
		berth[w.label] = w.figure(fioCPU(t, "berth", server, dev, w, seconds))
		t.Logf("berth %s: %.0f %s", w.label, berth[w.label], w.unit())
	}

	for _, w := range cephWorkloads {
		fmt.Printf("CEPH_BENCH_RESULT workload=%s unit=%s rbd_bench=%.0f rbd_bench_nocache=%.0f rbd_fuse=%.0f rbd_fuse_nocache=%.0f berth=%.0f\n",
			strings.ReplaceAll(w.label, " ", "_"), w.unit(), rbdBench[w.label], rbdNoCache[w.label], fuse[w.label], fuseNoCache[w.label], berth[w.label])
	}
}

// rbdBenchOps runs rbd bench for w, moving total bytes, with the extra
// options, and returns its operations per second.
func rbdBenchOps(ctx context.Context, c *testceph.Cluster, spec string, w cephWorkload, total int64, extra ...string) (float64, error) {
	args := append(append([]string{}, extra...), "bench", "--io-type", w.rbdType, "--io-pattern", w.rbdPattern,
		"--io-size", strconv.Itoa(w.bs), "--io-threads", strconv.Itoa(w.depth), "--io-total", strconv.FormatInt(total, 10), spec)
	out, err := c.RBD(ctx, args...)
	if err != nil {
		return 0, fmt.Errorf("rbd bench %s: %w: %s", w.label, err, out)
	}
	// The summary: "elapsed: 9  ops: 16384  ops/sec: 1755.3  bytes/sec: ...".
	fields := strings.Fields(string(out))
	for i, fl := range fields {
		if fl == "ops/sec:" && i+1 < len(fields) {
			return strconv.ParseFloat(fields[i+1], 64)
		}
	}
	return 0, fmt.Errorf("rbd bench %s: no ops/sec in %q", w.label, out)
}

// fioCPU is fioOps, and logs the CPU time that the process pid (the
// server under the block device) spent per operation meanwhile: where a
// 2-core machine's time goes.
func fioCPU(t *testing.T, who string, pid int, dev string, w cephWorkload, seconds int) float64 {
	t.Helper()
	before := procCPU(pid)
	ops := fioOps(t, dev, w, seconds)
	if used := procCPU(pid) - before; ops > 0 {
		t.Logf("%s %s: server CPU %.2f cores, %.0f µs per operation", who, w.label,
			used.Seconds()/float64(seconds), float64(used.Microseconds())/(ops*float64(seconds)))
	}
	return ops
}

// procCPU is the user and system time the process pid has used.
func procCPU(pid int) time.Duration {
	f := procStat(pid)
	if len(f) < 13 {
		return 0
	}
	// utime and stime (fields 14 and 15 of stat), in clock ticks of 1/100 s.
	u, _ := strconv.ParseInt(f[11], 10, 64)
	s, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(u+s) * 10 * time.Millisecond
}

// fioOps runs fio (direct, libaio) on dev for w and returns its IOPS.
func fioOps(t *testing.T, dev string, w cephWorkload, seconds int) float64 {
	t.Helper()
	out, err := exec.Command("fio", "--name=bench", "--filename="+dev, "--rw="+w.fioRW, "--bs="+strconv.Itoa(w.bs),
		"--iodepth="+strconv.Itoa(w.depth), "--ioengine=libaio", "--direct=1", "--time_based",
		"--runtime="+strconv.Itoa(seconds), "--randrepeat=0", "--norandommap", "--output-format=json").Output()
	if err != nil {
		t.Fatalf("fio %s on %s: %v: %s", w.label, dev, err, out)
	}
	var r struct {
		Jobs []struct {
			Read, Write struct {
				IOPS float64 `json:"iops"`
			}
		}
	}
	if err := json.Unmarshal(out, &r); err != nil || len(r.Jobs) != 1 {
		t.Fatalf("fio %s output: %v: %s", w.label, err, out)
	}
	if w.rbdType == "read" {
		return r.Jobs[0].Read.IOPS
	}
	return r.Jobs[0].Write.IOPS
}

// withRBDFuse serves spec (POOL/IMAGE) with rbd-fuse as the berth client,
// with the extra Ceph options, puts a direct-io loop device on its file and
// calls run with it; then detaches the loop device, stops rbd-fuse by its
// PID and unmounts.
func withRBDFuse(t *testing.T, c *testceph.Cluster, spec string, extra []string, run func(dev string, pid int)) {
	t.Helper()
	pool, image, _ := strings.Cut(spec, "/")
	mnt := filepath.Join(t.TempDir(), "rbd-fuse")
	if err := os.Mkdir(mnt, 0o700); err != nil {
		t.Fatal(err)
	}
	logf, err := os.Create(filepath.Join(t.TempDir(), "rbd-fuse.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = logf.Close() }()
	// -f: in the foreground, so that its PID is ours to stop.
	args := append([]string{"-f", "-c", c.Conf, "--id", c.Client, "--keyring", c.Keyring}, extra...)
	cmd := exec.Command("rbd-fuse", append(args, "-p", pool, "-r", image, mnt)...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatalf("rbd-fuse: %v", err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	defer func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
		if ok, _ := mount.New("").IsMountPoint(mnt); ok {
			if err := syscall.Unmount(mnt, syscall.MNT_DETACH); err != nil {
				t.Errorf("unmount rbd-fuse at %s: %v", mnt, err)
			}
		}
	}()
	file := filepath.Join(mnt, image)
	deadline := time.Now().Add(30 * time.Second)
	for {
		if _, err := os.Stat(file); err == nil {
			break
		}
		select {
		case <-done:
			b, _ := os.ReadFile(logf.Name())
			t.Fatalf("rbd-fuse exited: %s", b)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("rbd-fuse serves no %s within 30s", file)
		}
		time.Sleep(100 * time.Millisecond)
	}
	out, err := exec.Command("losetup", "--direct-io=on", "--find", "--show", file).CombinedOutput()
	if err != nil {
		t.Fatalf("losetup on %s: %v: %s", file, err, out)
	}
	dev := strings.TrimSpace(string(out))
	defer func() {
		if out, err := exec.Command("losetup", "-d", dev).CombinedOutput(); err != nil {
			t.Errorf("losetup -d %s: %v: %s", dev, err, out)
		}
	}()
	if b, err := os.ReadFile(filepath.Join("/sys/block", filepath.Base(dev), "loop", "dio")); err != nil || strings.TrimSpace(string(b)) != "1" {
		t.Logf("rbd-fuse: %s has no direct I/O on its file (dio %q, %v)", dev, b, err)
	}
	run(dev, cmd.Process.Pid)
}

// stageCephBlock makes the berth Volume of the RBD image spec as a block
// volume with mounter userspace, stages and publishes it through the agent
// as kubelet does, and returns the published device; cleanup unpublishes
// and unstages it.
func (f *fixture) stageCephBlock(t *testing.T, nc csi.NodeClient, c *testceph.Cluster, name, spec string, mib int) string {
	t.Helper()
	ctx := context.Background()
	size := resource.MustParse(strconv.Itoa(mib) + "Mi")
	vol := &v1.Volume{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: v1.VolumeSpec{StorageCluster: name,
		Size: size, AccessMode: v1.ReadWriteOnce, VolumeMode: v1.VolumeModeBlock, Mounter: v1.MounterUserspace}}
	if err := f.env.Client.Create(ctx, vol); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = f.env.Client.Delete(context.Background(), vol) })
	vol.Status = v1.VolumeStatus{State: v1.VolumeAvailable, Path: spec, Capacity: &size}
	if err := f.env.Client.Status().Update(ctx, vol); err != nil {
		t.Fatal(err)
	}
	m := f.paths(t, name)
	blockCap := &csi.VolumeCapability{
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
		AccessType: &csi.VolumeCapability_Block{Block: &csi.VolumeCapability_BlockVolume{}},
	}
	if err := retryBusy(func() error {
		_, err := nc.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: name, StagingTargetPath: m.staging,
			VolumeCapability: blockCap, Secrets: cephSecrets(t, c)})
		return err
	}); err != nil {
		t.Fatalf("stage %s: %v", name, err)
	}
	t.Cleanup(func() { f.unstage(t, nc, m) })
	if err := retryBusy(func() error {
		_, err := nc.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: name, StagingTargetPath: m.staging,
			TargetPath: m.target, VolumeCapability: blockCap})
		return err
	}); err != nil {
		t.Fatalf("publish %s: %v", name, err)
	}
	return m.target
}
