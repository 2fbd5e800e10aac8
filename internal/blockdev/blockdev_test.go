package blockdev_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/moby/sys/mountinfo"
	"golang.org/x/sys/unix"

	"github.com/berth-io/berth/internal/blockdev"
	"github.com/berth-io/berth/internal/blockdev/launch"
	"github.com/berth-io/berth/internal/keeper"
	"github.com/berth-io/berth/internal/testenv"
)

// TestServeExt4 serves an image, puts a loop device and ext4 on disk.img and
// reads back what it wrote, past the page cache.
func TestServeExt4(t *testing.T) {
	bothModes(t, testServeExt4)
}

func testServeExt4(t *testing.T, passthrough bool) {
	needKernel(t)
	r := newRig(t, 256<<20)
	r.passthrough = passthrough
	r.startServer()
	r.attachAndMount()
	want := make([]byte, 8<<20)
	_, _ = rand.Read(want)
	path := filepath.Join(r.fsDir, "data")
	if err := os.WriteFile(path, want, 0o600); err != nil {
		t.Fatal(err)
	}
	testenv.Run(t, "sync")
	if err := os.WriteFile("/proc/sys/vm/drop_caches", []byte("3"), 0); err != nil {
		t.Logf("drop caches: %v", err)
	}
	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatal("read back differs from what was written")
	}
	if err := blockdev.CheckMount(r.mountpoint); err != nil {
		t.Fatalf("CheckMount: %v", err)
	}
	wantFUSEOptions(t, r.mountpoint, "allow_other", "default_permissions")
	vols, err := keeper.NewClient(r.socket).List(context.Background())
	if err != nil || len(vols) != 1 || !vols[0].Initialized || vols[0].Mountpoint != r.mountpoint {
		t.Fatalf("keeper list = %+v, %v; want one initialized volume", vols, err)
	}
	conn, err := keeper.NewClient(r.socket).Get(context.Background(), r.volume)
	if err != nil {
		t.Fatal(err)
	}
	_ = conn.File.Close()
	set, err := blockdev.ParseSettings(conn.Settings)
	if err != nil {
		t.Fatal(err)
	}
	if set.Passthrough() != passthrough || (set.BackingID > 0) != passthrough {
		t.Fatalf("saved settings: passthrough %v backing %d, want passthrough %v", set.Passthrough(), set.BackingID, passthrough)
	}
}

// wantFUSEOptions reads the keeper's FUSE mount at mountpoint from
// /proc/self/mountinfo and wants each option among its super options.
func wantFUSEOptions(t *testing.T, mountpoint string, opts ...string) {
	t.Helper()
	ms, err := mountinfo.GetMounts(mountinfo.SingleEntryFilter(mountpoint))
	if err != nil || len(ms) != 1 {
		t.Fatalf("mountinfo for %s: %+v, %v; want one mount", mountpoint, ms, err)
	}
	have := strings.Split(ms[0].VFSOptions, ",")
	for _, o := range opts {
		if !slices.Contains(have, o) {
			t.Errorf("FUSE mount %s (%s) lacks option %s: %q", mountpoint, ms[0].FSType, o, ms[0].VFSOptions)
		}
	}
}

// TestTakeoverUnderVerifyingWriter kills the server again and again while fio
// writes and verifies (crc32c) through ext4, starting a new server each time:
// no I/O error, ext4 stays read-write, every block verifies.
func TestTakeoverUnderVerifyingWriter(t *testing.T) {
	bothModes(t, testTakeover)
}

func testTakeover(t *testing.T, passthrough bool) {
	needKernel(t, "fio")
	if testing.Short() {
		t.Skip("takeover cycles take ~30 s")
	}
	cycles := 10
	if n, err := strconv.Atoi(os.Getenv("BERTH_TAKEOVER_CYCLES")); err == nil && n > 0 {
		cycles = n
	}
	r := newRig(t, 512<<20)
	r.passthrough = passthrough
	logStart := len(testenv.KernelLog(t))
	r.startServer()
	r.attachAndMount()

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	fio := exec.CommandContext(ctx, "fio", "--name=verify", "--filename="+filepath.Join(r.fsDir, "fio.dat"),
		"--size=128M", "--rw=randwrite", "--bs=4k", "--iodepth=16", "--ioengine=libaio", "--direct=1",
		"--verify=crc32c", "--verify_backlog=512", "--verify_fatal=1", "--do_verify=1",
		"--time_based", "--runtime="+strconv.Itoa(cycles*10+60), "--output-format=terse")
	fio.Dir = t.TempDir() // fio writes its verify state file into its working directory
	var fioOut bytes.Buffer
	fio.Stdout, fio.Stderr = &fioOut, &fioOut
	if err := fio.Start(); err != nil {
		t.Fatal(err)
	}
	fioDone := make(chan error, 1)
	go func() { fioDone <- fio.Wait() }()

	time.Sleep(2 * time.Second)
	for i := range cycles {
		old := r.server
		if i%4 == 3 {
			// A graceful stop: requests in hand are answered, the rest
			// are left to the next server's resend.
			if err := old.Stop(10 * time.Second); err != nil {
				t.Fatal(err)
			}
		} else if err := old.Kill(); err != nil {
			t.Fatal(err)
		}
		// Every third restart is immediate: the new server waits in the
		// keeper until the killed one has exited. I/O stalls meanwhile.
		time.Sleep(time.Duration(i%3) * 400 * time.Millisecond)
		r.startServer()
		<-old.Done()
		time.Sleep(time.Second)
		select {
		case err := <-fioDone:
			t.Fatalf("fio ended during cycle %d: %v\n%s", i, err, fioOut.String())
		default:
		}
	}
	// The cycles are done: fio stops at SIGINT and still writes its
	// report, whose error field says whether a block failed. It exits 0,
	// or 128 when the signal found it mid-verify. Its runtime is only a
	// bound: one derived from a cycle's usual pace (2 s) ended fio in
	// cycle 8 of 10 on a busy CI machine (3.4 s a cycle).
	if err := fio.Process.Signal(os.Interrupt); err != nil {
		t.Fatalf("stop fio: %v", err)
	}
	var exit *exec.ExitError
	if err := <-fioDone; err != nil && (!errors.As(err, &exit) || exit.ExitCode() != 128) {
		t.Fatalf("fio: %v\n%s", err, fioOut.String())
	}
	// Terse format field 5 is the job's error code.
	fields := strings.Split(fioOut.String(), ";")
	if len(fields) < 5 || fields[4] != "0" {
		t.Fatalf("fio reported an error: %s", fioOut.String())
	}
	if opts := mountOptions(r.fsDir); !strings.HasPrefix(opts, "rw") || strings.Contains(opts, " ro") {
		t.Fatalf("ext4 is no longer read-write: %q", opts)
	}
	if bad := kernelErrors(t, logStart, filepath.Base(r.loop)); len(bad) > 0 {
		t.Fatalf("kernel reported errors on %s:\n%s", r.loop, strings.Join(bad, "\n"))
	}
	t.Logf("%d takeovers under fio randwrite+verify: no error, ext4 %s", cycles, mountOptions(r.fsDir))
}

// TestKeeperDeathIsDetected documents that a keeper restart is not
// survivable: while its server lives the volume still works, but once the
// server is gone too the connection is aborted, and both the keeper ping and
// CheckMount say so.
func TestKeeperDeathIsDetected(t *testing.T) {
	needKernel(t)
	r := newRig(t, 64<<20)
	srv := r.startServer()
	r.killKeeper()
	ctx := context.Background()
	if err := keeper.NewClient(r.socket).Ping(ctx); !errors.Is(err, keeper.ErrUnavailable) {
		t.Fatalf("Ping after keeper death = %v, want ErrUnavailable", err)
	}
	if err := blockdev.CheckMount(r.mountpoint); err != nil {
		t.Fatalf("with the server alive the mount still works, got %v", err)
	}
	if err := srv.Kill(); err != nil {
		t.Fatal(err)
	}
	<-srv.Done()
	if err := blockdev.CheckMount(r.mountpoint); !errors.Is(err, blockdev.ErrDisconnected) {
		t.Fatalf("CheckMount with keeper and server dead = %v, want ErrDisconnected", err)
	}
}

// TestSecondServerRefused: while a server lives, the keeper refuses the
// connection to another (two servers would answer resent writes twice).
func TestSecondServerRefused(t *testing.T) {
	needKernel(t)
	r := newRig(t, 64<<20)
	first := r.startServer()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	second, err := launch.Start(ctx, launch.Params{Binary: berthBinary(t), KeeperSocket: r.socket,
		Volume: r.volume, Image: r.image, Mountpoint: r.mountpoint, Stderr: r.log})
	if err == nil {
		_ = second.Kill()
		t.Fatal("a second server started while the first lives")
	}
	if !strings.Contains(r.log.String(), "served by another live process") {
		t.Fatalf("second server failed for another reason: %v", err)
	}
	vols, err := keeper.NewClient(r.socket).List(ctx)
	if err != nil || len(vols) != 1 || vols[0].ServerPID != first.PID() {
		t.Fatalf("List = %+v, %v; want server pid %d", vols, err, first.PID())
	}
}

// TestStopPID stops a server by pid alone, as a restarted agent would.
func TestStopPID(t *testing.T) {
	needKernel(t)
	r := newRig(t, 64<<20)
	p := r.startServer()
	// A pid that no longer names the server (the check fails once the
	// pidfd is open) is left alone.
	if err := launch.StopPID(p.PID(), time.Second, func() bool { return false }); err != nil {
		t.Fatal(err)
	}
	select {
	case <-p.Done():
		t.Fatal("StopPID signalled a process its check refused")
	case <-time.After(200 * time.Millisecond):
	}
	if err := launch.StopPID(p.PID(), 5*time.Second, func() bool { return true }); err != nil {
		t.Fatal(err)
	}
	select {
	case <-p.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("server still running after StopPID")
	}
	if err := launch.StopPID(p.PID(), time.Second, nil); err != nil {
		t.Fatalf("StopPID of a gone process: %v", err)
	}
	// The connection outlives the server: the next one takes over.
	r.startServer()
	if err := blockdev.CheckMount(r.mountpoint); err != nil {
		t.Fatal(err)
	}
}

// TestImageGrownBehindServer grows the image behind a running server, as
// the backend does on expansion: the FUSE file must show the new size, and
// so the loop device on it once its capacity is refreshed.
func TestImageGrownBehindServer(t *testing.T) {
	bothModes(t, testImageGrown)
}

func testImageGrown(t *testing.T, passthrough bool) {
	needKernel(t)
	r := newRig(t, 64<<20)
	r.passthrough = passthrough
	r.startServer()
	file := filepath.Join(r.mountpoint, blockdev.FileName)
	r.loop = testenv.Run(t, "losetup", "--direct-io=on", "--find", "--show", file)
	const want = 128 << 20
	if err := os.Truncate(r.image, want); err != nil {
		t.Fatal(err)
	}
	var st unix.Statx_t
	if err := unix.Statx(unix.AT_FDCWD, file, unix.AT_STATX_FORCE_SYNC, unix.STATX_SIZE, &st); err != nil {
		t.Fatal(err)
	}
	if st.Size != want {
		t.Fatalf("%s: %d bytes after the image grew, want %d", file, st.Size, want)
	}
	testenv.Run(t, "losetup", "--set-capacity", r.loop)
	b, err := os.ReadFile(filepath.Join("/sys/block", filepath.Base(r.loop), "size"))
	if err != nil {
		t.Fatal(err)
	}
	if n, _ := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64); n*512 != want {
		t.Fatalf("loop device %s: %d bytes after refresh, want %d", r.loop, n*512, want)
	}
}
