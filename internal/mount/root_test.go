package mount

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/berth-io/berth/internal/volerr"
)

// holdOpen starts a process that keeps dev open (as its stdin) until the
// test kills it; it is killed by PID at cleanup in any case.
func holdOpen(t *testing.T, dev string) *exec.Cmd {
	t.Helper()
	f, err := os.Open(dev)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = f.Close() }()
	cmd := exec.Command("sleep", "60")
	cmd.Stdin = f
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	return cmd
}

func TestRootFilesystemLifecycle(t *testing.T) {
	for _, tc := range []struct {
		fs   string
		size int64
	}{{"ext4", 64 * mib}, {"xfs", 320 * mib}} {
		t.Run(tc.fs, func(t *testing.T) {
			e := newRootEnv(t)
			img := e.image(t, "vol", tc.size)
			dev := e.attach(t, img)
			if again := e.attach(t, img); again != dev {
				t.Fatalf("second attach gave %s, first %s", again, dev)
			}
			staging := e.path("staging")
			req := StageRequest{VolumeID: "v", Device: dev, StagingPath: staging, FSType: tc.fs}
			for range 2 {
				if err := e.mgr.Stage(e.ctx, req); err != nil {
					t.Fatal(err)
				}
			}
			if n := mountsOf(t, dev); n != 1 {
				t.Fatalf("%d mounts after two stages", n)
			}
			if err := os.WriteFile(filepath.Join(staging, "hello"), []byte("world"), 0o644); err != nil {
				t.Fatal(err)
			}
			// Another device on the same staging path is refused.
			other := e.attach(t, e.image(t, "other", 64*mib))
			if err := e.mgr.Stage(e.ctx, StageRequest{Device: other, StagingPath: staging}); !errors.Is(err, ErrExists) {
				t.Fatalf("other device: want ErrExists, got %v", err)
			}

			t1, t2 := e.path("pod1/mount"), e.path("pod2/mount")
			pub := PublishRequest{VolumeID: "v", StagingPath: staging, TargetPath: t1}
			for range 2 {
				if err := e.mgr.Publish(e.ctx, pub); err != nil {
					t.Fatal(err)
				}
			}
			ro := PublishRequest{VolumeID: "v", StagingPath: staging, TargetPath: t2, ReadOnly: true}
			if err := e.mgr.Publish(e.ctx, ro); err != nil {
				t.Fatal(err)
			}
			if got, err := os.ReadFile(filepath.Join(t1, "hello")); err != nil || string(got) != "world" {
				t.Fatalf("read through pod1: %q %v", got, err)
			}
			if err := os.WriteFile(filepath.Join(t2, "x"), nil, 0o644); err == nil {
				t.Fatal("write through read-only publish succeeded")
			}
			if n := mountsOf(t, dev); n != 3 {
				t.Fatalf("%d mounts, want staging + 2 pods", n)
			}
			// Same target, other read-only mode: refused.
			pub.ReadOnly = true
			if err := e.mgr.Publish(e.ctx, pub); !errors.Is(err, ErrExists) {
				t.Fatalf("ro change: want ErrExists, got %v", err)
			}
			// A file where a directory is needed: refused, left alone.
			file := e.path("afile")
			if err := os.WriteFile(file, []byte("keep"), 0o644); err != nil {
				t.Fatal(err)
			}
			if err := e.mgr.Publish(e.ctx, PublishRequest{StagingPath: staging, TargetPath: file}); !errors.Is(err, volerr.ErrInvalid) {
				t.Fatalf("file target: want volerr.ErrInvalid, got %v", err)
			}
			if got, _ := os.ReadFile(file); string(got) != "keep" {
				t.Fatalf("file target changed: %q", got)
			}

			for range 2 {
				if err := e.mgr.Unpublish(e.ctx, t1); err != nil {
					t.Fatal(err)
				}
			}
			if _, err := os.Stat(t1); !errors.Is(err, os.ErrNotExist) {
				t.Fatalf("target left behind: %v", err)
			}
			if _, err := e.mgr.Unstage(e.ctx, staging); !errors.Is(err, ErrInUse) {
				t.Fatalf("unstage with a pod left: want ErrInUse, got %v", err)
			}
			if n := mountsOf(t, dev); n != 2 {
				t.Fatalf("refused unstage changed mounts: %d", n)
			}
			if err := e.mgr.Unpublish(e.ctx, t2); err != nil {
				t.Fatal(err)
			}
			got, err := e.mgr.Unstage(e.ctx, staging)
			if err != nil || got != dev {
				t.Fatalf("unstage: %q %v, want %s", got, err, dev)
			}
			if got, err := e.mgr.Unstage(e.ctx, staging); err != nil || got != "" {
				t.Fatalf("second unstage: %q %v", got, err)
			}
			if _, err := os.Stat(staging); !errors.Is(err, os.ErrNotExist) {
				t.Fatalf("staging dir left: %v", err)
			}
			for range 2 {
				if err := e.loop.Detach(e.ctx, dev); err != nil {
					t.Fatal(err)
				}
			}
			if n := loopsFor(t, img); n != 0 {
				t.Fatalf("%d loop devices left", n)
			}
		})
	}
}

func TestRootBlock(t *testing.T) {
	e := newRootEnv(t)
	img := e.image(t, "blk", 64*mib)
	dev := e.attach(t, img)
	staging := e.path("staging")
	req := StageRequest{VolumeID: "b", Device: dev, StagingPath: staging, Block: true}
	for range 2 {
		if err := e.mgr.Stage(e.ctx, req); err != nil {
			t.Fatal(err)
		}
	}
	if got, block, err := e.mgr.StagedDevice(e.ctx, staging); err != nil || got != dev || !block {
		t.Fatalf("staged device %q %t %v", got, block, err)
	}
	dir := e.path("dirtarget")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := e.mgr.Publish(e.ctx, PublishRequest{StagingPath: staging, TargetPath: dir, Device: dev, Block: true}); !errors.Is(err, volerr.ErrInvalid) {
		t.Fatalf("dir target for block: want volerr.ErrInvalid, got %v", err)
	}
	target := e.path("pod/dev")
	pub := PublishRequest{VolumeID: "b", StagingPath: staging, TargetPath: target, Block: true}
	for range 2 { // the second finds it published; no Device: taken from staging
		if err := e.mgr.Publish(e.ctx, pub); err != nil {
			t.Fatal(err)
		}
	}
	f, err := os.OpenFile(target, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte("through the pod"), 4096); err != nil {
		t.Fatal(err)
	}
	_ = f.Sync()
	_ = f.Close()
	data, _ := os.ReadFile(img)
	if string(data[4096:4096+15]) != "through the pod" {
		t.Fatal("write through the published device did not reach the image")
	}
	st, err := e.mgr.Stats(e.ctx, target)
	if err != nil || !st.Block || st.TotalBytes != 64*mib {
		t.Fatalf("stats %+v %v", st, err)
	}
	if _, err := e.mgr.Unstage(e.ctx, staging); !errors.Is(err, ErrInUse) {
		t.Fatalf("unstage with pod: want ErrInUse, got %v", err)
	}
	// A process holding the device open also blocks unstage.
	if err := e.mgr.Unpublish(e.ctx, target); err != nil {
		t.Fatal(err)
	}
	holder := holdOpen(t, dev)
	if _, err := e.mgr.Unstage(e.ctx, staging); !errors.Is(err, ErrInUse) || !strings.Contains(err.Error(), strconv.Itoa(holder.Process.Pid)) {
		t.Fatalf("unstage with open handle: want ErrInUse naming pid %d, got %v", holder.Process.Pid, err)
	}
	_ = holder.Process.Kill()
	_ = holder.Wait()
	got, err := e.mgr.Unstage(e.ctx, staging)
	if err != nil || got != dev {
		t.Fatalf("unstage: %q %v", got, err)
	}
	if err := e.loop.Detach(e.ctx, dev); err != nil {
		t.Fatal(err)
	}
}

// growCase is a filesystem and the sizes a growth test takes it between
// (xfs wants 300 MiB at the least).
type growCase struct {
	fs       string
	from, to int64
}

// growCases are the growths TestRootExpandOnline and TestRootGrowAtStage run.
func growCases() []growCase {
	return []growCase{{"ext4", 64 * mib, 128 * mib}, {"xfs", 320 * mib, 512 * mib}}
}

func TestRootExpandOnline(t *testing.T) {
	for _, tc := range growCases() {
		t.Run(tc.fs, func(t *testing.T) {
			e := newRootEnv(t)
			if tc.fs == "ext4" && !hasCapSysResource(t) {
				t.Skip("ext4 online resize needs CAP_SYS_RESOURCE (EXT4_IOC_RESIZE_FS gives EPERM without it); this process lacks it")
			}
			img := e.image(t, "vol", tc.from)
			req := e.stage(t, img, StageRequest{FSType: tc.fs})
			dev, staging := req.Device, req.StagingPath
			before, err := e.mgr.Stats(e.ctx, staging)
			if err != nil {
				t.Fatal(err)
			}
			e.grow(t, img, dev, tc.to)
			for range 2 { // a retry finds nothing to do
				if err := e.mgr.Expand(e.ctx, dev, staging); err != nil {
					t.Fatal(err)
				}
			}
			e.requireGrown(t, staging, before, tc.to-tc.from)
		})
	}
}

// A crash after attach (state lost) and a retried stage leave exactly one
// loop device and one mount.
func TestRootCrashRetry(t *testing.T) {
	e := newRootEnv(t)
	img := e.image(t, "vol", 64*mib)
	_ = e.attach(t, img) // "crash": the device name is forgotten
	staging := e.path("staging")
	for range 2 { // the retry, and a retry of the retry after a crash post-mount
		dev := e.attach(t, img)
		if err := e.mgr.Stage(e.ctx, StageRequest{Device: dev, StagingPath: staging}); err != nil {
			t.Fatal(err)
		}
	}
	dev, found, err := e.loop.Find(e.ctx, img)
	if err != nil || !found {
		t.Fatalf("find: %v %t", err, found)
	}
	if n := loopsFor(t, img); n != 1 {
		t.Fatalf("%d loop devices over the image", n)
	}
	if n := mountsOf(t, dev); n != 1 {
		t.Fatalf("%d mounts of %s", n, dev)
	}
	if abnormal, msg := e.mgr.Condition(e.ctx, staging); abnormal {
		t.Fatalf("healthy volume reported abnormal: %s", msg)
	}
}

func TestRootConditionLoopDetached(t *testing.T) {
	e := newRootEnv(t)
	req := e.stage(t, e.image(t, "blk", 64*mib), StageRequest{Block: true})
	dev, staging := req.Device, req.StagingPath
	if abnormal, msg := e.mgr.Condition(e.ctx, staging); abnormal {
		t.Fatalf("healthy block staging abnormal: %s", msg)
	}
	if err := e.loop.Detach(e.ctx, dev); err != nil {
		t.Fatal(err)
	}
	if abnormal, msg := e.mgr.Condition(e.ctx, staging); !abnormal || !strings.Contains(msg, "backing file") {
		t.Fatalf("detached loop: %t %q", abnormal, msg)
	}
}

// A volume grown while unstaged is the new size once staged again, with no
// capability needed (ext4 grows before the mount, xfs right after it).
func TestRootGrowAtStage(t *testing.T) {
	for _, tc := range growCases() {
		t.Run(tc.fs, func(t *testing.T) {
			e := newRootEnv(t)
			img := e.image(t, "vol", tc.from)
			req := e.stage(t, img, StageRequest{VolumeID: "v", FSType: tc.fs})
			dev, staging := req.Device, req.StagingPath
			if err := os.WriteFile(filepath.Join(staging, "keep"), []byte("data"), 0o644); err != nil {
				t.Fatal(err)
			}
			before, err := e.mgr.Stats(e.ctx, staging)
			if err != nil {
				t.Fatal(err)
			}
			e.unstage(t, staging)
			e.grow(t, img, dev, tc.to)
			req.Format = FormatPolicy{Never: true, Why: "the volume was formatted before"}
			if err := e.mgr.Stage(e.ctx, req); err != nil {
				t.Fatal(err)
			}
			e.requireGrown(t, staging, before, tc.to-tc.from)
			if got, err := os.ReadFile(filepath.Join(staging, "keep")); err != nil || string(got) != "data" {
				t.Fatalf("data after growth: %q %v", got, err)
			}
			// Staged again at full size: nothing to grow, still fine.
			e.unstage(t, staging)
			if err := e.mgr.Stage(e.ctx, req); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// Without CAP_SYS_RESOURCE a mounted ext4 cannot grow: Expand says it grows
// at the next stage (ErrGrowsAtStage), and the next stage grows it.
func TestRootExpandWithoutCapabilityGrowsAtStage(t *testing.T) {
	e := newRootEnv(t)
	if hasCapSysResource(t) {
		t.Skip("this process has CAP_SYS_RESOURCE: ext4 grows online here (TestRootExpandOnline)")
	}
	img := e.image(t, "vol", 64*mib)
	req := e.stage(t, img, StageRequest{VolumeID: "v", FSType: "ext4"})
	dev, staging := req.Device, req.StagingPath
	e.grow(t, img, dev, 128*mib)
	if err := e.mgr.Expand(e.ctx, dev, staging); !errors.Is(err, ErrGrowsAtStage) {
		t.Fatalf("online ext4 growth without the capability: want ErrGrowsAtStage, got %v", err)
	}
	e.unstage(t, staging)
	if err := e.mgr.Stage(e.ctx, req); err != nil {
		t.Fatal(err)
	}
	st, err := e.mgr.Stats(e.ctx, staging)
	if err != nil {
		t.Fatal(err)
	}
	if st.TotalBytes < 100*mib {
		t.Fatalf("staged again: %d MiB, want about 128", st.TotalBytes/mib)
	}
}
