package blockdev_test

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/moby/sys/mountinfo"
	"golang.org/x/sys/unix"

	"github.com/berth-io/berth/internal/blockdev"
	"github.com/berth-io/berth/internal/blockdev/launch"
	"github.com/berth-io/berth/internal/keeper"
	"github.com/berth-io/berth/internal/testenv"
)

// binary is the berth binary, built once per test run.
var (
	buildOnce sync.Once
	binPath   string
	buildErr  error
	binDir    string
)

func TestMain(m *testing.M) {
	code := m.Run()
	if binDir != "" {
		_ = os.RemoveAll(binDir)
	}
	os.Exit(code)
}

// bothModes runs test with the server doing the I/O, then with FUSE
// passthrough (the kernel doing it on the image).
func bothModes(t *testing.T, test func(t *testing.T, passthrough bool)) {
	for _, passthrough := range []bool{false, true} {
		name := "server-io"
		if passthrough {
			name = "passthrough"
		}
		t.Run(name, func(t *testing.T) { test(t, passthrough) })
	}
}

// needKernel skips without root, /dev/fuse or the tools the tests run.
func needKernel(t *testing.T, tools ...string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: mounts FUSE, attaches loop devices")
	}
	if _, err := os.Stat("/dev/fuse"); err != nil {
		t.Skipf("needs /dev/fuse: %v", err)
	}
	for _, tool := range append([]string{"losetup", "mkfs.ext4", "mount", "umount"}, tools...) {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("needs %s (hack/install-deps.sh): %v", tool, err)
		}
	}
}

func berthBinary(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		binDir, buildErr = os.MkdirTemp("", "berth-blockdev-test-")
		if buildErr != nil {
			return
		}
		binPath, buildErr = testenv.BuildBerth(binDir)
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return binPath
}

// rig is one keeper, one volume, its servers, loop device and ext4 mount.
type rig struct {
	t          *testing.T
	dir        string
	socket     string
	keeperCmd  *exec.Cmd
	keeperDone chan struct{}
	volume     string
	image      string
	mountpoint string // the FUSE mount
	fsDir      string // the ext4 mount
	loop       string
	log        *syncBuffer
	// passthrough starts servers in FUSE passthrough mode.
	passthrough bool
	mu          sync.Mutex
	server      *launch.Process
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// newRig starts a keeper and makes an image of size bytes. Cleanup removes
// everything in reverse, also after a failure.
func newRig(t *testing.T, size int64) *rig {
	t.Helper()
	bin := berthBinary(t)
	// Not t.TempDir(): its removal would race the lazy unmount of a dead
	// mount; everything is removed explicitly in cleanup.
	dir, err := os.MkdirTemp("", "berth-bd-")
	if err != nil {
		t.Fatal(err)
	}
	r := &rig{t: t, dir: dir, socket: filepath.Join(dir, "run", "keeper.sock"), volume: "vol-" + filepath.Base(dir),
		image: filepath.Join(dir, "image"), mountpoint: filepath.Join(dir, "fuse"), fsDir: filepath.Join(dir, "fs"), log: &syncBuffer{}}
	t.Cleanup(r.cleanup)
	if err := os.WriteFile(r.image, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(r.image, size); err != nil {
		t.Fatal(err)
	}
	r.keeperCmd = exec.Command(bin, "keeper", "--socket", r.socket)
	r.keeperCmd.Stderr = r.log
	r.keeperCmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := r.keeperCmd.Start(); err != nil {
		t.Fatal(err)
	}
	r.keeperDone = make(chan struct{})
	go func() { _ = r.keeperCmd.Wait(); close(r.keeperDone) }()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for {
		if err := keeper.NewClient(r.socket).Ping(ctx); err == nil {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("keeper did not answer: %s", r.log)
		case <-time.After(20 * time.Millisecond):
		}
	}
	return r
}

// startServer starts a server and waits until it serves.
func (r *rig) startServer() *launch.Process {
	r.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	p, err := launch.Start(ctx, launch.Params{
		Binary: berthBinary(r.t), KeeperSocket: r.socket, Volume: r.volume,
		Image: r.image, Mountpoint: r.mountpoint, Stderr: r.log, Passthrough: r.passthrough,
	})
	if err != nil {
		r.t.Fatalf("start server: %v\nlog:\n%s", err, r.log)
	}
	r.mu.Lock()
	r.server = p
	r.mu.Unlock()
	return p
}

// attachAndMount puts a loop device on disk.img, makes ext4 and mounts it.
func (r *rig) attachAndMount() {
	r.t.Helper()
	r.loop = testenv.Run(r.t, "losetup", "--direct-io=on", "--find", "--show", filepath.Join(r.mountpoint, blockdev.FileName))
	testenv.Run(r.t, "mkfs.ext4", "-q", "-F", r.loop)
	if err := os.MkdirAll(r.fsDir, 0o700); err != nil {
		r.t.Fatal(err)
	}
	testenv.Run(r.t, "mount", "-o", "errors=remount-ro", r.loop, r.fsDir)
}

func (r *rig) killKeeper() {
	_ = r.keeperCmd.Process.Signal(syscall.SIGKILL)
	<-r.keeperDone
}

func (r *rig) cleanup() {
	t := r.t
	lazy := false
	if mounted(r.fsDir) {
		if out, err := exec.Command("umount", r.fsDir).CombinedOutput(); err != nil {
			t.Logf("umount %s: %v: %s; lazy", r.fsDir, err, out)
			_ = unix.Unmount(r.fsDir, unix.MNT_DETACH)
			lazy = true
		}
	}
	if r.loop != "" {
		if out, err := exec.Command("losetup", "-d", r.loop).CombinedOutput(); err != nil {
			t.Logf("losetup -d %s: %v: %s", r.loop, err, out)
		}
	}
	r.mu.Lock()
	srv := r.server
	r.mu.Unlock()
	if srv != nil {
		_ = srv.Stop(5 * time.Second)
	}
	if r.keeperCmd != nil && r.keeperCmd.Process != nil {
		select {
		case <-r.keeperDone:
		default:
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			if err := keeper.NewClient(r.socket).Close(ctx, r.volume); err != nil {
				t.Logf("keeper close: %v", err)
			}
			cancel()
			r.killKeeper()
		}
	}
	if mounted(r.mountpoint) {
		if lazy {
			// The detached ext4 still flushes through this connection
			// when its last user goes (RemoveAll below can be that user).
			// With the server stopped and a keeper still holding
			// /dev/fuse, nobody would answer: the flush, and the test,
			// waited for ever (seen once, CI starved of CPU).
			if err := testenv.AbortFUSE(r.mountpoint); err != nil {
				t.Log(err)
			} else {
				t.Logf("aborted the FUSE connection at %s (ext4 above it detached lazily)", r.mountpoint)
			}
		}
		_ = unix.Unmount(r.mountpoint, unix.MNT_DETACH)
	}
	if err := os.RemoveAll(r.dir); err != nil {
		t.Logf("remove %s: %v", r.dir, err)
	}
	if t.Failed() {
		t.Logf("process log:\n%s", r.log)
	}
}

// mounted reads mountinfo (stat would hang or fail on a dead FUSE mount).
func mounted(path string) bool {
	return mountOptions(path) != ""
}

// mountOptions returns the per-mount and super options of path, "" if not
// mounted.
func mountOptions(path string) string {
	ms, err := mountinfo.GetMounts(mountinfo.SingleEntryFilter(path))
	if err != nil || len(ms) == 0 {
		return ""
	}
	return ms[0].Options + " " + ms[0].VFSOptions
}

// kernelErrors returns the lines after the first skip lines of the kernel
// log that report errors on dev (e.g. "loop3") or its ext4. Lines from
// before dev's last attach ("detected capacity change from 0") are left
// out: they are about another user of the same loop number, such as a
// package that hack/gotest.sh runs beside this one.
func kernelErrors(t *testing.T, skip int, dev string) []string {
	t.Helper()
	lines := testenv.KernelLog(t)
	for i := len(lines) - 1; i >= skip; i-- {
		if strings.Contains(lines[i], dev+": detected capacity change from 0 ") {
			skip = i
			break
		}
	}
	var bad []string
	for i := skip; i < len(lines); i++ {
		l := lines[i]
		ours := strings.Contains(l, dev+",") || strings.Contains(l, dev+":") || strings.Contains(l, "("+dev+")")
		if ours && (strings.Contains(l, "error") || strings.Contains(l, "read-only")) {
			bad = append(bad, l)
		}
	}
	return bad
}
