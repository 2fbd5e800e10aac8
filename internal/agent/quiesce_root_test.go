package agent

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	"golang.org/x/sys/unix"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/exec"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/berth-io/berth/api/v1alpha1"
	"github.com/berth-io/berth/internal/backend"
	"github.com/berth-io/berth/internal/mount"
)

// quiesceEnv is a real local backend (on the test's temp dir, which on this
// machine's ext4 has no reflink: copies are chunked) whose copies hold the
// source through a real agent, and one volume attached to a loop device.
type quiesceEnv struct {
	images *backend.Local
	mounts *mount.Manager
	loop   mount.Loop
	dev    string
	agent  *Agent
}

func newQuiesceEnv(t *testing.T, objs ...client.Object) *quiesceEnv {
	t.Helper()
	return newQuiesceEnvSized(t, 64<<20, objs...)
}

// newQuiesceEnvSized is newQuiesceEnv with a volume of size bytes (xfs
// wants 300 MiB at least).
func newQuiesceEnvSized(t *testing.T, size int64, objs ...client.Object) *quiesceEnv {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: real loop devices, mkfs and mounts")
	}
	log := testr.NewWithInterface(t, testr.Options{})
	images, err := backend.NewLocal(t.TempDir(), log)
	if err != nil {
		t.Skipf("local backend: %v", err)
	}
	e := &quiesceEnv{images: images, loop: mount.NewLoop(exec.New()), mounts: mount.NewManager(mount.NewMounter(), exec.New(), log)}
	a := newTestAgent(t, Config{Images: images, Loop: e.loop, Mounts: e.mounts, Log: log, API: fakeAPI(t, objs...).Build(),
		FreezeDir: t.TempDir()})
	e.agent = a
	images.WithQuiescer(a)
	img, err := images.Create(t.Context(), "vol", size)
	if err != nil {
		t.Fatal(err)
	}
	if e.dev, err = e.loop.Attach(t.Context(), img.Path, false); err != nil {
		t.Skipf("loop device: %v", err)
	}
	t.Cleanup(func() {
		if err := e.loop.Detach(context.Background(), e.dev); err != nil {
			t.Errorf("detach %s: %v", e.dev, err)
		}
	})
	return e
}

// TestRootSnapshotOfStagedVolumeIsConsistent: snapshots of a mounted ext4
// volume under a writer, on a data dir without reflink, are point-in-time
// copies: the filesystem in each is clean and was frozen (its journal needs
// no recovery), it holds the files written before it, and every file has
// the content its name promises. Today's main copies the live image chunk
// by chunk while the filesystem keeps changing: a torn, stale copy.
func TestRootSnapshotOfStagedVolumeIsConsistent(t *testing.T) {
	e := newQuiesceEnv(t)
	staging := e.stage(t, false)

	e.checkFrozen(t, e.copiesUnderWriter(t, staging, false))
}

// newRWXQuiesceEnv is a quiesceEnv whose volume is an RWX one (a share manager
// serves its filesystem; the agent stages it as a block device).
func newRWXQuiesceEnv(t *testing.T) *quiesceEnv {
	return newQuiesceEnv(t, &v1.Volume{ObjectMeta: metav1.ObjectMeta{Name: "vol"}, Spec: v1.VolumeSpec{StorageCluster: "c",
		Size: resource.MustParse("64Mi"), AccessMode: v1.ReadWriteMany, VolumeMode: v1.VolumeModeFilesystem, FSType: "ext4"}})
}

// stage stages the volume's device at a new staging path (as a raw block
// device with block) and unstages it when the test ends.
func (e *quiesceEnv) stage(t *testing.T, block bool) string {
	t.Helper()
	return e.stageFS(t, block, "")
}

// stageFS is stage with a filesystem of fsType ("": ext4).
func (e *quiesceEnv) stageFS(t *testing.T, block bool, fsType string) string {
	t.Helper()
	staging := filepath.Join(t.TempDir(), "staging")
	if err := e.mounts.Stage(t.Context(), mount.StageRequest{VolumeID: "vol", Device: e.dev, StagingPath: staging, Block: block, FSType: fsType}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if _, err := e.mounts.Unstage(context.Background(), staging); err != nil {
			t.Errorf("unstage: %v", err)
		}
	})
	return staging
}

// copiesUnderWriter takes three snapshots of the volume (and a clone, with
// clone) while a writer keeps adding files in dir, the volume's filesystem
// mounted somewhere, and returns the copies' image paths.
func (e *quiesceEnv) copiesUnderWriter(t *testing.T, dir string, clone bool) []string {
	t.Helper()
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var writeErr error
	wg.Go(func() { writeErr = writeFiles(dir, stop) })
	fail := func(format string, args ...any) {
		close(stop)
		wg.Wait()
		t.Fatalf(format, args...)
	}
	var copies []string
	for i := range 3 {
		time.Sleep(200 * time.Millisecond)
		s, err := e.images.CreateSnapshot(t.Context(), fmt.Sprintf("snap-%d", i), "vol")
		if err != nil {
			fail("snapshot %d: %v", i, err)
		}
		copies = append(copies, s.Path)
	}
	if clone {
		c, err := e.images.CreateFromVolume(t.Context(), "clone", "vol", 64<<20)
		if err != nil {
			fail("clone: %v", err)
		}
		copies = append(copies, c.Path)
	}
	close(stop)
	wg.Wait()
	if writeErr != nil {
		t.Fatalf("writer: %v", writeErr)
	}
	return copies
}

// checkFrozen checks that each copy is a clean filesystem taken frozen
// (its journal needs no recovery) holding whole files.
func (e *quiesceEnv) checkFrozen(t *testing.T, copies []string) {
	t.Helper()
	for _, p := range copies {
		out, err := exec.New().Command("e2fsck", "-fn", p).CombinedOutput()
		if err != nil {
			t.Errorf("copy %s is not a clean filesystem: %v\n%s", p, err, out)
			continue
		}
		// A frozen ext4 has flushed its journal: nothing to recover.
		if out, err := exec.New().Command("dumpe2fs", "-h", p).CombinedOutput(); err != nil || strings.Contains(string(out), "needs_recovery") {
			t.Errorf("copy %s was not taken frozen (journal needs recovery): %v\n%s", p, err, out)
		}
		checkFiles(t, e.loop, p)
	}
}

// TestRootSnapshotOfStagedBlockVolumeRefused: a volume staged as a raw
// block device has no filesystem to freeze: without reflink its copy is
// refused (ErrSourceInUse) rather than torn; unstaged, it is copied.
func TestRootSnapshotOfStagedBlockVolumeRefused(t *testing.T) {
	e := newQuiesceEnv(t)
	ctx := t.Context()
	staging := filepath.Join(t.TempDir(), "staging")
	if err := e.mounts.Stage(ctx, mount.StageRequest{VolumeID: "vol", Device: e.dev, StagingPath: staging, Block: true}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.images.CreateSnapshot(ctx, "snap-staged", "vol"); !errors.Is(err, backend.ErrSourceInUse) {
		t.Errorf("snapshot of a staged block volume: %v, want ErrSourceInUse", err)
	}
	if _, err := e.images.CreateFromVolume(ctx, "clone-staged", "vol", 64<<20); !errors.Is(err, backend.ErrSourceInUse) {
		t.Errorf("clone of a staged block volume: %v, want ErrSourceInUse", err)
	}
	if _, err := e.mounts.Unstage(ctx, staging); err != nil {
		t.Fatal(err)
	}
	if err := e.loop.Detach(ctx, e.dev); err != nil {
		t.Fatal(err)
	}
	if _, err := e.images.CreateSnapshot(ctx, "snap-idle", "vol"); err != nil {
		t.Errorf("snapshot of an unstaged volume: %v", err)
	}
	// Attached again for the cleanup's detach.
	dev, err := e.loop.Attach(ctx, mustImage(t, e.images, "vol"), false)
	if err != nil {
		t.Fatal(err)
	}
	e.dev = dev
}

func mustImage(t *testing.T, images *backend.Local, id string) string {
	t.Helper()
	img, err := images.Get(t.Context(), id)
	if err != nil {
		t.Fatal(err)
	}
	return img.Path
}

// writeFiles writes files named after the sha256 of their content until
// stop: each through a temp name, renamed once whole, and removes some, so
// data and metadata change all the time.
func writeFiles(dir string, stop <-chan struct{}) error {
	rng := rand.New(rand.NewPCG(1, 2))
	buf := make([]byte, 96<<10)
	for i := 0; ; i++ {
		select {
		case <-stop:
			return nil
		default:
		}
		for j := range buf {
			buf[j] = byte(rng.Uint32())
		}
		sum := sha256.Sum256(buf)
		tmp := filepath.Join(dir, "tmp")
		if err := os.WriteFile(tmp, buf, 0o644); err != nil {
			return err
		}
		if err := os.Rename(tmp, filepath.Join(dir, hex.EncodeToString(sum[:]))); err != nil {
			return err
		}
		if i%3 == 2 {
			ents, err := os.ReadDir(dir)
			if err != nil {
				return err
			}
			for _, ent := range ents[:len(ents)/3] {
				if len(ent.Name()) == 64 {
					if err := os.Remove(filepath.Join(dir, ent.Name())); err != nil {
						return err
					}
				}
			}
		}
	}
}

// checkFiles mounts a snapshot image read-only and checks every file whose
// name is a sha256 against its content.
func checkFiles(t *testing.T, loop mount.Loop, image string) {
	t.Helper()
	dev, err := loop.Attach(t.Context(), image, true)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = loop.Detach(context.Background(), dev) }()
	dir := t.TempDir()
	if err := unix.Mount(dev, dir, "ext4", unix.MS_RDONLY, "noload"); err != nil {
		t.Fatalf("mount snapshot %s: %v", image, err)
	}
	defer func() { _ = unix.Unmount(dir, 0) }()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, ent := range ents {
		if len(ent.Name()) != 64 || strings.HasPrefix(ent.Name(), ".") {
			continue
		}
		b, err := os.ReadFile(filepath.Join(dir, ent.Name()))
		if err != nil {
			t.Errorf("snapshot %s: read %s: %v", image, ent.Name(), err)
			continue
		}
		if sum := sha256.Sum256(b); hex.EncodeToString(sum[:]) != ent.Name() {
			t.Errorf("snapshot %s: %s holds other content (%d bytes)", image, ent.Name(), len(b))
		}
		n++
	}
	if n == 0 {
		t.Errorf("snapshot %s holds no file", image)
	}
}
