package mount

import (
	"context"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/go-logr/logr/testr"
	"golang.org/x/sys/unix"
	mountutils "k8s.io/mount-utils"
	"k8s.io/utils/exec"

	"github.com/berth-io/berth/internal/testenv"
)

const mib = 1 << 20

// rootEnv is a real Manager and Loop in a temp dir that is cleaned of every
// mount and loop device under it when the test ends, even on failure.
type rootEnv struct {
	dir  string
	mgr  *Manager
	loop Loop
	ctx  context.Context
}

func newRootEnv(t testing.TB) *rootEnv {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: real loop devices and mounts")
	}
	if _, err := os.Stat("/dev/loop-control"); err != nil {
		t.Skipf("needs loop devices: /dev/loop-control: %v", err)
	}
	dir := t.TempDir()
	e := &rootEnv{
		dir:  dir,
		mgr:  NewManager(NewMounter(), exec.New(), testr.NewWithInterface(t, testr.Options{})),
		loop: NewLoop(exec.New()),
		ctx:  context.Background(),
	}
	// Registered after TempDir, so it runs before TempDir's removal.
	t.Cleanup(func() { cleanupUnder(t, e.loop, dir) })
	return e
}

func cleanupUnder(t testing.TB, loop Loop, dir string) {
	for range 8 {
		mis, err := readMountInfo()
		if err != nil {
			t.Error(err)
			return
		}
		var under []string
		for _, mi := range mis {
			if strings.HasPrefix(mi.MountPoint, dir+"/") {
				under = append(under, mi.MountPoint)
			}
		}
		if len(under) == 0 {
			break
		}
		sort.Sort(sort.Reverse(sort.StringSlice(under))) // children first
		for _, p := range under {
			_ = mountutils.New("").Unmount(p)
		}
	}
	var files []string
	_ = filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() && strings.HasSuffix(p, ".img") {
			files = append(files, p)
		}
		return nil
	})
	for _, f := range files {
		for {
			dev, found, err := loop.Find(context.Background(), f)
			if err != nil || !found {
				break
			}
			if err := loop.Detach(context.Background(), dev); err != nil {
				t.Errorf("cleanup detach %s: %v", dev, err)
				break
			}
		}
	}
}

// image makes a sparse file of size bytes in the env's dir.
func (e *rootEnv) image(t testing.TB, name string, size int64) string {
	t.Helper()
	p := filepath.Join(e.dir, name+".img")
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = f.Close() }()
	if err := f.Truncate(size); err != nil {
		t.Fatal(err)
	}
	return p
}

func (e *rootEnv) attach(t testing.TB, img string) string {
	t.Helper()
	dev, err := e.loop.Attach(e.ctx, img, false)
	if err != nil {
		t.Fatal(err)
	}
	return dev
}

// stage attaches img and stages it as req says, at e.path("staging") unless
// req names a staging path; it returns req with the device and path set.
func (e *rootEnv) stage(t testing.TB, img string, req StageRequest) StageRequest {
	t.Helper()
	req.Device = e.attach(t, img)
	if req.StagingPath == "" {
		req.StagingPath = e.path("staging")
	}
	if err := e.mgr.Stage(e.ctx, req); err != nil {
		t.Fatalf("stage %s: %v", img, err)
	}
	return req
}

// unstage unstages the volume at staging (its device stays attached).
func (e *rootEnv) unstage(t testing.TB, staging string) {
	t.Helper()
	if _, err := e.mgr.Unstage(e.ctx, staging); err != nil {
		t.Fatalf("unstage %s: %v", staging, err)
	}
}

// grow makes img size bytes and has its loop device dev see the new size.
func (e *rootEnv) grow(t testing.TB, img, dev string, size int64) {
	t.Helper()
	if err := os.Truncate(img, size); err != nil {
		t.Fatal(err)
	}
	if err := e.loop.Refresh(e.ctx, dev); err != nil {
		t.Fatal(err)
	}
}

// loopsFor counts loop devices over img, as losetup -j sees them.
func loopsFor(t *testing.T, img string) int {
	t.Helper()
	return len(testenv.LoopsOf(t, img))
}

// mountsOf counts mounts of dev's filesystem in /proc/self/mountinfo.
func mountsOf(t *testing.T, dev string) int {
	t.Helper()
	mis, err := readMountInfo()
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, mi := range mis {
		if sameDevice(dev, mi.Major, mi.Minor) {
			n++
		}
	}
	return n
}

func (e *rootEnv) path(name string) string { return filepath.Join(e.dir, name) }

// hasCapSysResource reads the effective capability set: some sandboxes run
// root without CAP_SYS_RESOURCE, which ext4 online resize requires.
func hasCapSysResource(t *testing.T) bool {
	t.Helper()
	data, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, "CapEff:"); ok {
			caps, err := strconv.ParseUint(strings.TrimSpace(v), 16, 64)
			if err != nil {
				t.Fatal(err)
			}
			return caps&(1<<unix.CAP_SYS_RESOURCE) != 0
		}
	}
	return false
}

// requireGrown fails unless the filesystem at path grew by most of by bytes
// since before: filesystem overhead eats some of the growth, never most.
func (e *rootEnv) requireGrown(t *testing.T, path string, before Stats, by int64) {
	t.Helper()
	after, err := e.mgr.Stats(e.ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	if grown := after.TotalBytes - before.TotalBytes; grown < by*3/4 {
		t.Fatalf("total %d -> %d: grew %d of %d", before.TotalBytes, after.TotalBytes, grown, by)
	}
	t.Logf("%d MiB -> %d MiB", before.TotalBytes/mib, after.TotalBytes/mib)
}
