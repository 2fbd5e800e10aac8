package sharemanager_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/testr"
	"k8s.io/utils/clock"

	"github.com/berth-io/berth/internal/share/nfsclient"
	"github.com/berth-io/berth/internal/testenv"
)

// shareEnv is a real volume (an ext4 on a loop device over an image file)
// and the berth binary, for share managers run as processes the way the
// controller's pods would run them.
type shareEnv struct {
	dir, dev, bin string
	port          int
	volume        string
}

func newShareEnv(t testing.TB) *shareEnv {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: loop devices, mounts and nfs-ganesha")
	}
	for _, tool := range []string{"ganesha.nfsd", "losetup", "mkfs.ext4"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("needs %s (hack/install-deps.sh installs nfs-ganesha nfs-ganesha-vfs e2fsprogs): %v", tool, err)
		}
	}
	if _, err := os.Stat("/usr/lib/x86_64-linux-gnu/ganesha/libfsalvfs.so"); err != nil {
		t.Skipf("needs ganesha's VFS FSAL (Debian package nfs-ganesha-vfs): %v", err)
	}
	dir := t.TempDir()
	img := filepath.Join(dir, "volume.img")
	if err := os.WriteFile(img, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(img, 512<<20); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("losetup", "--find", "--show", "--direct-io=on", img).CombinedOutput()
	if err != nil {
		t.Fatalf("losetup: %v: %s", err, out)
	}
	e := &shareEnv{dir: dir, dev: strings.TrimSpace(string(out)), port: testenv.FreePort(t), volume: "pvc-share"}
	t.Cleanup(func() {
		mnt := e.mountPath()
		for i := 0; i < 5 && exec.Command("mountpoint", "-q", mnt).Run() == nil; i++ {
			_ = syscall.Unmount(mnt, 0)
		}
		if out, err := exec.Command("losetup", "-d", e.dev).CombinedOutput(); err != nil {
			t.Errorf("losetup -d %s: %v: %s", e.dev, err, out)
		}
	})
	e.bin = buildBerth(t)
	return e
}

func (e *shareEnv) mountPath() string { return filepath.Join(e.dir, "mnt") }
func (e *shareEnv) stateDir() string  { return filepath.Join(e.dir, "state") }
func (e *shareEnv) endpoint() nfsclient.Endpoint {
	return nfsclient.Endpoint{Addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(e.port)), Export: "/" + e.volume}
}

var (
	buildOnce sync.Once
	binDir    string
	binPath   string
	buildErr  error
)

func buildBerth(t testing.TB) string {
	buildOnce.Do(func() {
		if binDir, buildErr = os.MkdirTemp("", "berth-share-test-"); buildErr == nil {
			binPath, buildErr = testenv.BuildBerth(binDir)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return binPath
}

// suite is the API server of the lease test; the failover test needs none.
var suite = &testenv.Suite{Root: true}

func TestMain(m *testing.M) {
	code := testenv.Main(m, suite)
	if binDir != "" {
		_ = os.RemoveAll(binDir)
	}
	os.Exit(code)
}

// start runs a share manager the way its pod does, and waits until it is
// ready (its ready file appears) or fails.
func (e *shareEnv) start(t testing.TB, extra ...string) *testenv.Process {
	t.Helper()
	// A killed share manager leaves its ready file behind (a pod's
	// readiness probe would see it too until the new one removes it).
	if err := os.Remove(filepath.Join(e.stateDir(), "ready")); err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	args := append([]string{e.bin, "share-manager",
		"--volume", e.volume, "--device", e.dev, "--mount-path", e.mountPath(), "--state-dir", e.stateDir(),
		"--bind-address", "127.0.0.1", "--port", strconv.Itoa(e.port),
		// The only userspace NFSv4 client at hand speaks NFSv4.0 only.
		"--nfs-minor-versions", "0,1,2", "--check-interval", "1s",
		// A short lease and grace keep the restarts quick (the defaults,
		// 15 s each, tripled this package's time); the clients here run
		// on an idle loopback.
		"--nfs-lease", "5s", "--nfs-grace", "5s"}, extra...)
	p, err := testenv.StartProcess(filepath.Join(e.dir, "share-manager.log"), args...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Stop(syscall.SIGTERM, 20*time.Second) })
	deadline := time.Now().Add(30 * time.Second)
	for {
		if _, err := os.Stat(filepath.Join(e.stateDir(), "ready")); err == nil {
			return p
		}
		if p.Exited() || time.Now().After(deadline) {
			t.Fatalf("share manager not ready (exited: %v); log:\n%s", p.Exited(), e.log())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (e *shareEnv) log() string {
	b, _ := os.ReadFile(filepath.Join(e.dir, "share-manager.log"))
	return string(b)
}

func (e *shareEnv) ganeshaPid(t testing.TB) int {
	b, err := os.ReadFile(filepath.Join(e.stateDir(), "ganesha.pid"))
	if err != nil {
		t.Fatal(err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	return pid
}

// ack is a file whose write the server acknowledged (every write is
// stable: --sync-writes).
type ack struct {
	name string
	sum  [32]byte
	at   time.Time
	// conn is the client's connection count when the write returned.
	conn uint64
}

// writer writes new files of random size and content until stopped,
// retrying each (reconnecting) until the server acknowledges it.
type writer struct {
	mu   sync.Mutex
	acks []ack
	err  error
}

// fileClient writes one whole file, retrying until it is durable, and
// counts the connections it made.
type fileClient interface {
	WriteFile(ctx context.Context, name string, data []byte) error
	Connects() uint64
}

// v41Client writes each file over a new NFSv4.1 session: unstable WRITEs,
// COMMIT, read back and compare; every attempt is a new connection.
type v41Client struct {
	ep       nfsclient.Endpoint
	attempts atomic.Uint64
}

func (c *v41Client) Connects() uint64 { return c.attempts.Load() }

func (c *v41Client) WriteFile(ctx context.Context, name string, data []byte) error {
	return nfsclient.Retry41(ctx, clock.RealClock{}, 0, func(ctx context.Context) error {
		c.attempts.Add(1)
		got, err := nfsclient.WriteCommitRead41(ctx, c.ep, name, data, 1, "failover-test")
		if err == nil && !bytes.Equal(got, data) {
			return fmt.Errorf("%s read back differs right after COMMIT", name)
		}
		return err
	})
}

func (w *writer) run(ctx context.Context, c fileClient) {
	for i := 0; ctx.Err() == nil; i++ {
		// Up to 64 KiB a file: every acknowledged file is kept to be read
		// back at the end, and with up to 256 KiB 20 rounds could fill the
		// 512 MiB volume. A full volume is then an endless retry here: the
		// NFSv4.0 library's WRITE error is lost in its deferred CLOSE, so
		// it reports a short write of 0 bytes and no error.
		data := make([]byte, 1+mrand.IntN(64<<10))
		_, _ = rand.Read(data)
		name := fmt.Sprintf("f%06d.bin", i)
		err := c.WriteFile(ctx, name, data)
		if ctx.Err() != nil {
			return
		}
		w.mu.Lock()
		if err != nil {
			w.err = err
			w.mu.Unlock()
			return
		}
		w.acks = append(w.acks, ack{name: name, sum: sha256.Sum256(data), at: time.Now(), conn: c.Connects()})
		w.mu.Unlock()
	}
}

// firstAckOver waits for the first acknowledgement on a connection made
// after the client had made conns: an answer from the next server, not
// one the killed server sent just before it died.
func (w *writer) firstAckOver(conns uint64, timeout time.Duration) (time.Time, error) {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		w.mu.Lock()
		acks, err := w.acks, w.err
		w.mu.Unlock()
		if err != nil {
			return time.Time{}, err
		}
		if i := slices.IndexFunc(acks, func(a ack) bool { return a.conn > conns }); i >= 0 {
			return acks[i].at, nil
		}
		time.Sleep(5 * time.Millisecond)
	}
	return time.Time{}, fmt.Errorf("no acknowledged write within %s", timeout)
}

func (w *writer) snapshot() []ack {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.acks)
}

// failovers is how many times the test kills a share manager or its
// ganesha (BERTH_SHARE_FAILOVERS, default 20).
func failovers(t testing.TB) int {
	n := 20
	if s := os.Getenv("BERTH_SHARE_FAILOVERS"); s != "" {
		v, err := strconv.Atoi(s)
		if err != nil || v < 1 {
			t.Fatalf("BERTH_SHARE_FAILOVERS=%q", s)
		}
		n = v
	}
	return n
}

// TestFailoverLosesNoAcknowledgedWrite is the RWX acceptance test on a
// real device, a real ext4 and a real ganesha: a userspace NFSv4 client
// writes files while ganesha (odd rounds) or the whole share manager (even
// rounds) is SIGKILLed; the test, standing in for the controller, starts a
// new share manager, and the client resumes on its own. At the end every
// acknowledged file must read back with its checksum. Two clients: the
// NFSv4.0 library (durable through the export's stable writes) and berth's
// NFSv4.1 sessions (unstable WRITE + COMMIT). The kill -> first
// acknowledged write figures are printed as SHARE_FAILOVER_RESULT, never
// asserted. The two run side by side: each has its own loop device, port,
// state and recovery folders (ganesha gets its pid file and config from the
// share manager's state folder), and most of a round is spent waiting for
// a new ganesha and its grace period.
func TestFailoverLosesNoAcknowledgedWrite(t *testing.T) {
	t.Run("nfs4.0-stable-writes", func(t *testing.T) {
		t.Parallel()
		testFailover(t, "4.0", func(e *shareEnv, log logr.Logger) (fileClient, func()) {
			c := nfsclient.New(e.endpoint(), nfsclient.Options{OpTimeout: 3 * time.Second, MaxRetryInterval: 100 * time.Millisecond},
				clock.RealClock{}, log.WithName("client"))
			return c, c.Close
		})
	})
	t.Run("nfs4.1-commit", func(t *testing.T) {
		t.Parallel()
		testFailover(t, "4.1", func(e *shareEnv, _ logr.Logger) (fileClient, func()) {
			return &v41Client{ep: e.endpoint()}, func() {}
		})
	})
}

func testFailover(t *testing.T, proto string, newClient func(*shareEnv, logr.Logger) (fileClient, func())) {
	e := newShareEnv(t)
	sm := e.start(t)
	log := testr.NewWithOptions(t, testr.Options{Verbosity: 0})
	client, closeClient := newClient(e, log)
	defer closeClient()
	ctx, cancel := context.WithCancel(context.Background())
	w := &writer{}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); w.run(ctx, client) }()
	stopWriter := func() { cancel(); wg.Wait() }
	defer stopWriter()

	if _, err := w.firstAckOver(0, 30*time.Second); err != nil {
		t.Fatalf("before any failover: %v\n%s", err, e.log())
	}
	n := failovers(t)
	var byKill = map[string][]time.Duration{}
	var all []time.Duration
	for i := 0; i < n; i++ {
		// Let a few writes land on this server first.
		time.Sleep(time.Duration(100+mrand.IntN(400)) * time.Millisecond)
		what := "ganesha"
		gpid := e.ganeshaPid(t)
		killedAt := time.Now()
		if i%2 == 0 {
			if err := syscall.Kill(gpid, syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			// The share manager notices, cleans up and fails.
			if !waitExit(sm, 20*time.Second) {
				t.Fatalf("round %d: the share manager still runs after its ganesha was killed:\n%s", i+1, e.log())
			}
			if code := sm.ExitCode(); code == 0 {
				t.Fatalf("round %d: share manager exited 0 after its ganesha died", i+1)
			}
		} else {
			what = "share-manager"
			sm.Stop(syscall.SIGKILL, time.Second)
		}
		// Its ganesha must not outlive it (it would hold the port).
		if !waitGone(gpid, 5*time.Second) {
			t.Fatalf("round %d: ganesha %d outlived the kill of its %s", i+1, gpid, what)
		}
		// Answers on connections made from here on come from the next
		// server.
		conns := client.Connects()
		sm = e.start(t)
		at, err := w.firstAckOver(conns, 60*time.Second)
		if err != nil {
			t.Fatalf("round %d (%s killed): %v\n%s", i+1, what, err, e.log())
		}
		d := at.Sub(killedAt)
		byKill[what] = append(byKill[what], d)
		all = append(all, d)
		t.Logf("round %d: %s SIGKILLed, first acknowledged write %s later", i+1, what, d.Round(time.Millisecond))
	}
	stopWriter()

	// Every acknowledged file reads back with its checksum.
	acks := w.snapshot()
	verify := nfsclient.New(e.endpoint(), nfsclient.Options{}, clock.RealClock{}, log.WithName("verify"))
	defer verify.Close()
	vctx, vcancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer vcancel()
	var bytesRead int
	for _, a := range acks {
		got, err := verify.ReadFile(vctx, a.name)
		if err != nil {
			t.Fatalf("read back %s: %v", a.name, err)
		}
		bytesRead += len(got)
		if sha256.Sum256(got) != a.sum {
			t.Errorf("%s: content differs from the acknowledged write (%d bytes read)", a.name, len(got))
		}
	}
	// And on the device itself, after a clean stop (unmounts).
	sm.Stop(syscall.SIGTERM, 20*time.Second)
	if code := sm.ExitCode(); code != 0 {
		t.Errorf("share manager exited %d on SIGTERM:\n%s", code, e.log())
	}
	if exec.Command("mountpoint", "-q", e.mountPath()).Run() == nil {
		t.Errorf("%s still mounted after SIGTERM", e.mountPath())
	}
	if out, err := exec.Command("fsck.ext4", "-n", "-f", e.dev).CombinedOutput(); err != nil {
		t.Errorf("fsck after %d failovers: %v\n%s", n, err, out)
	}
	for what, ds := range byKill {
		t.Logf("SHARE_FAILOVER_RESULT nfs=%s kill=%s failovers=%d p50=%s p99=%s max=%s", proto, what, len(ds), pct(ds, 50), pct(ds, 99), pct(ds, 100))
	}
	fmt.Printf("SHARE_FAILOVER_RESULT nfs=%s kill=any failovers=%d p50=%s p99=%s max=%s files=%d bytes=%d lost=0\n",
		proto, len(all), pct(all, 50), pct(all, 99), pct(all, 100), len(acks), bytesRead)
}

// pct is the p-th percentile (nearest rank) of ds.
func pct(ds []time.Duration, p int) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	i := (p*len(s) + 99) / 100
	i = min(max(i, 1), len(s))
	return s[i-1].Round(time.Millisecond)
}

func waitExit(p *testenv.Process, timeout time.Duration) bool {
	deadline := time.Now().Add(timeout)
	for !p.Exited() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(5 * time.Millisecond)
	}
	return true
}

func waitGone(pid int, timeout time.Duration) bool {
	deadline := time.Now().Add(timeout)
	for {
		err := syscall.Kill(pid, 0)
		if errors.Is(err, syscall.ESRCH) {
			return true
		}
		// A zombie still answers kill 0; it holds no port.
		if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid)); err == nil && strings.Contains(string(b), ") Z ") {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(5 * time.Millisecond)
	}
}
