package blockdev_test

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/berth-io/berth/internal/keeper"
	"github.com/berth-io/berth/internal/testenv"
)

// TestKeeperHandOverUnderWriters replaces the keeper process
// BERTH_KEEPER_HANDOVERS times (default 50) while a verifying writer runs
// on each of BERTH_KEEPER_HANDOVER_VOLUMES (default 5) userspace volumes
// (FUSE file, loop device, ext4): each time a new `berth keeper` starts on
// the same socket and takes everything over, then the old one is stopped
// and must exit 0. Every fourth time a server is killed and started again
// meanwhile, so that it asks a keeper in the middle of a hand-over. No
// writer may see an I/O error or a checksum failure. It prints one
// KEEPER_HANDOVER_RESULT line (hack/bench.sh): the stall of each volume
// in each cycle (its longest write+fdatasync+read round), p50/p99/max.
func TestKeeperHandOverUnderWriters(t *testing.T) {
	needKernel(t)
	if testing.Short() {
		t.Skip("50 keeper hand-overs under writers take about a minute")
	}
	cycles := envCount("BERTH_KEEPER_HANDOVERS", 50)
	nvol := envCount("BERTH_KEEPER_HANDOVER_VOLUMES", 5)
	h := newHandOverRig(t)
	for i := range nvol {
		h.addVolume(fmt.Sprintf("kh-%d", i))
	}
	logStart := len(testenv.KernelLog(t))
	writers := make([]*verifier, nvol)
	for i, v := range h.vols {
		writers[i] = startVerifier(t, filepath.Join(v.fsDir, "data"), uint64(i+1))
	}
	time.Sleep(300 * time.Millisecond)

	// windows[c] is cycle c's span; restarted[c] the volume whose server
	// was restarted in it (-1: none).
	var windows [][2]int64
	var restarted []int
	var takeovers []time.Duration
	// overlapped counts the hand-overs that refused a server's request
	// (it asked again, of the new keeper).
	restarts, overlapped := 0, 0
	for c := range cycles {
		start := time.Now()
		old := h.keeper
		h.keeper = h.startKeeper()
		restarted = append(restarted, -1)
		if c%4 == 1 {
			// While the keepers hand over, after 0, 50 or 100 ms: the
			// new server asks one of them, maybe in the middle.
			restarts++
			i := (c / 4) % nvol
			restarted[c] = i
			time.Sleep(time.Duration(c/4%3) * 50 * time.Millisecond)
			h.restartServer(h.vols[i])
		}
		took := h.handedOver(old, start)
		if strings.Contains(old.log.String(), "refused during the hand-over") {
			overlapped++
		}
		h.checkServed()
		windows = append(windows, [2]int64{start.UnixNano(), time.Now().UnixNano()})
		takeovers = append(takeovers, took)
		time.Sleep(150 * time.Millisecond)
		for i, w := range writers {
			if err := w.failure(); err != nil {
				t.Fatalf("cycle %d: writer on %s: %v", c, h.vols[i].volume, err)
			}
		}
	}

	// stalls are of volumes whose keeper alone was replaced; withServer of
	// those whose server was restarted too.
	var stalls, withServer, quiet []time.Duration
	var rounds int
	var errs, bad int
	for i, w := range writers {
		err := w.finish(60 * time.Second)
		if err != nil {
			t.Errorf("writer on %s: %v", h.vols[i].volume, err)
		}
		errs += w.ioErrors
		bad += w.checksumErrors
		rounds += len(w.rounds)
		for c, win := range windows {
			if restarted[c] == i {
				withServer = append(withServer, w.longestIn(win[0], win[1]))
			} else {
				stalls = append(stalls, w.longestIn(win[0], win[1]))
			}
			// Between two cycles nothing is replaced: the writers'
			// own spread, to read the stalls against.
			if c+1 < len(windows) {
				quiet = append(quiet, w.longestIn(win[1]+int64(10*time.Millisecond), windows[c+1][0]-int64(10*time.Millisecond)))
			}
		}
	}
	for _, v := range h.vols {
		if opts := mountOptions(v.fsDir); !strings.HasPrefix(opts, "rw") || strings.Contains(opts, " ro") {
			t.Errorf("%s: ext4 is no longer read-write: %q", v.volume, opts)
		}
		if lines := kernelErrors(t, logStart, filepath.Base(v.loop)); len(lines) > 0 {
			t.Errorf("kernel reported errors on %s:\n%s", v.loop, strings.Join(lines, "\n"))
		}
	}
	for _, d := range []*[]time.Duration{&stalls, &withServer, &quiet} {
		if len(*d) == 0 {
			*d = []time.Duration{0}
		}
		slices.Sort(*d)
	}
	slices.Sort(takeovers)
	all := slices.Sorted(slices.Values(append(slices.Clone(stalls), withServer...)))
	pct := func(d []time.Duration, p float64) time.Duration {
		return d[int(p*float64(len(d)-1)+0.5)].Round(100 * time.Microsecond)
	}
	t.Logf("%d hand-overs (%d with a server restart, %d refusing it meanwhile) under %d writers: %d rounds, %d I/O errors, %d checksum failures, longest stall %s (%s with the keeper alone)",
		cycles, restarts, overlapped, nvol, rounds, errs, bad, pct(all, 1), pct(stalls, 1))
	// p50/p99/max over every volume and cycle; keeper_* over those whose
	// server ran on, server_max over those whose server was restarted,
	// quiet_p99 between cycles.
	fmt.Printf("KEEPER_HANDOVER_RESULT cycles=%d volumes=%d restarts=%d overlapped=%d samples=%d p50=%s p99=%s max=%s keeper_p99=%s keeper_max=%s server_max=%s quiet_p99=%s takeover_p50=%s takeover_max=%s rounds=%d errors=%d checksum=%d\n",
		cycles, nvol, restarts, overlapped, len(all), pct(all, 0.5), pct(all, 0.99), pct(all, 1), pct(stalls, 0.99), pct(stalls, 1),
		pct(withServer, 1), pct(quiet, 0.99), pct(takeovers, 0.5), pct(takeovers, 1), rounds, errs, bad)
	if errs+bad > 0 {
		t.Fatalf("%d I/O errors and %d checksum failures, want none", errs, bad)
	}
}

func envCount(name string, def int) int {
	if n, err := strconv.Atoi(os.Getenv(name)); err == nil && n > 0 {
		return n
	}
	return def
}

// handOverRig is a keeper process (replaced by the test) and userspace
// volumes, each a rig of its own on the rig's keeper socket.
type handOverRig struct {
	t      *testing.T
	dir    string
	socket string
	keeper *keeperProc
	// stopped are the keepers that handed over, for the cleanup.
	stopped []*keeperProc
	vols    []*rig
	log     *syncBuffer // the servers'
}

type keeperProc struct {
	cmd  *exec.Cmd
	done chan struct{}
	log  *syncBuffer
}

func newHandOverRig(t *testing.T) *handOverRig {
	t.Helper()
	// Not t.TempDir(): its removal would race a lazy unmount.
	dir, err := os.MkdirTemp("", "berth-kh-")
	if err != nil {
		t.Fatal(err)
	}
	h := &handOverRig{t: t, dir: dir, socket: filepath.Join(dir, "run", "keeper.sock"), log: &syncBuffer{}}
	t.Cleanup(h.cleanup)
	h.keeper = h.startKeeper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for keeper.NewClient(h.socket).Ping(ctx) != nil {
		if ctx.Err() != nil {
			t.Fatalf("keeper does not answer: %s", h.keeper.log)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return h
}

func (h *handOverRig) startKeeper() *keeperProc {
	h.t.Helper()
	k := &keeperProc{done: make(chan struct{}), log: &syncBuffer{}}
	k.cmd = exec.Command(berthBinary(h.t), "keeper", "--socket", h.socket)
	k.cmd.Stderr = k.log
	k.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := k.cmd.Start(); err != nil {
		h.t.Fatal(err)
	}
	go func() { _ = k.cmd.Wait(); close(k.done) }()
	return k
}

// handedOver waits until old handed over to the keeper started at start,
// stops old and wants it gone at once with status 0; it returns the time
// from start to the hand-over.
func (h *handOverRig) handedOver(old *keeperProc, start time.Time) time.Duration {
	h.t.Helper()
	for !strings.Contains(old.log.String(), "handed over to a new keeper") {
		select {
		case <-h.keeper.done:
			h.t.Fatalf("new keeper exited:\n%s\nold keeper:\n%s", h.keeper.log, old.log)
		default:
		}
		if time.Since(start) > 30*time.Second {
			h.t.Fatalf("no hand-over within 30s; new keeper:\n%s\nold keeper:\n%s", h.keeper.log, old.log)
		}
		time.Sleep(2 * time.Millisecond)
	}
	took := time.Since(start)
	h.stopped = append(h.stopped, old)
	_ = old.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-old.done:
	case <-time.After(5 * time.Second):
		h.t.Fatalf("the old keeper did not exit within 5s of SIGTERM after handing over:\n%s", old.log)
	}
	if code := old.cmd.ProcessState.ExitCode(); code != 0 {
		h.t.Fatalf("the old keeper exited %d:\n%s", code, old.log)
	}
	return took
}

// checkServed wants the keeper to hold every volume, served by its server.
func (h *handOverRig) checkServed() {
	h.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	held, err := keeper.NewClient(h.socket).List(ctx)
	if err != nil || len(held) != len(h.vols) {
		h.t.Fatalf("keeper holds %+v, %v; want %d volumes", held, err, len(h.vols))
	}
	for i, r := range h.vols {
		r.mu.Lock()
		pid := r.server.PID()
		r.mu.Unlock()
		if held[i].Name != r.volume || held[i].ServerPID != pid {
			h.t.Fatalf("keeper holds %+v, want %s served by %d", held[i], r.volume, pid)
		}
	}
}

// addVolume makes a 64 MiB image, serves it and puts ext4 on a loop device
// on its FUSE file.
func (h *handOverRig) addVolume(name string) {
	h.t.Helper()
	dir := filepath.Join(h.dir, name)
	r := &rig{t: h.t, dir: dir, socket: h.socket, volume: name, image: filepath.Join(dir, "image"),
		mountpoint: filepath.Join(dir, "fuse"), fsDir: filepath.Join(dir, "fs"), log: h.log}
	h.vols = append(h.vols, r)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		h.t.Fatal(err)
	}
	if err := os.WriteFile(r.image, nil, 0o600); err != nil {
		h.t.Fatal(err)
	}
	if err := os.Truncate(r.image, 64<<20); err != nil {
		h.t.Fatal(err)
	}
	r.startServer()
	r.attachAndMount()
}

// restartServer kills r's server, as a crash does, and starts another.
func (h *handOverRig) restartServer(r *rig) {
	r.mu.Lock()
	old := r.server
	r.mu.Unlock()
	_ = old.Kill()
	r.startServer()
	<-old.Done()
}

// cleanup undoes everything in reverse, also after a failure: each
// volume's rig, then the keepers.
func (h *handOverRig) cleanup() {
	for _, r := range slices.Backward(h.vols) {
		r.cleanup()
	}
	for _, k := range append(h.stopped, h.keeper) {
		if k != nil {
			_ = k.cmd.Process.Signal(syscall.SIGKILL)
			<-k.done
		}
	}
	if err := os.RemoveAll(h.dir); err != nil {
		h.t.Logf("remove %s: %v", h.dir, err)
	}
	if h.t.Failed() && h.keeper != nil {
		h.t.Logf("keeper's log:\n%s", h.keeper.log)
	}
}

// verifier writes 4 KiB blocks (sequence, index, random bytes, CRC-32C)
// at random places of an O_DIRECT file; each round writes one,
// fdatasyncs, reads it back and checks it. It keeps each round's span:
// the longest within a window is that window's stall.
type verifier struct {
	f    *os.File
	buf  []byte // page-aligned, for O_DIRECT
	last []uint64
	rnd  *rand.Rand

	mu             sync.Mutex
	rounds         [][2]int64
	err            error
	ioErrors       int
	checksumErrors int

	stop, done chan struct{}
}

const (
	verifyBlock  = 4096
	verifyBlocks = 2048 // 8 MiB
)

var crc32c = crc32.MakeTable(crc32.Castagnoli)

func startVerifier(t *testing.T, path string, seed uint64) *verifier {
	t.Helper()
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR|unix.O_DIRECT, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	buf, err := unix.Mmap(-1, 0, verifyBlock, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	if err != nil {
		t.Fatal(err)
	}
	v := &verifier{f: f, buf: buf, last: make([]uint64, verifyBlocks), rnd: rand.New(rand.NewPCG(seed, ^seed)),
		stop: make(chan struct{}), done: make(chan struct{})}
	t.Cleanup(func() {
		select {
		case <-v.stop:
		default:
			close(v.stop)
		}
		select {
		case <-v.done:
			_ = f.Close()
			_ = unix.Munmap(buf)
		case <-time.After(30 * time.Second):
			t.Error("writer stuck at the end")
		}
	})
	go v.run()
	return v
}

func (v *verifier) run() {
	defer close(v.done)
	for seq := uint64(1); ; seq++ {
		select {
		case <-v.stop:
			return
		default:
		}
		idx := v.rnd.IntN(verifyBlocks)
		start := time.Now().UnixNano()
		err := v.round(idx, seq)
		v.mu.Lock()
		v.rounds = append(v.rounds, [2]int64{start, time.Now().UnixNano()})
		v.mu.Unlock()
		if err != nil {
			v.fail(err)
			return
		}
	}
}

func (v *verifier) round(idx int, seq uint64) error {
	binary.LittleEndian.PutUint64(v.buf, seq)
	binary.LittleEndian.PutUint64(v.buf[8:], uint64(idx))
	for i := 16; i < verifyBlock-4; i += 8 {
		binary.LittleEndian.PutUint64(v.buf[i:], v.rnd.Uint64())
	}
	binary.LittleEndian.PutUint32(v.buf[verifyBlock-4:], crc32.Checksum(v.buf[:verifyBlock-4], crc32c))
	off := int64(idx) * verifyBlock
	if _, err := v.f.WriteAt(v.buf, off); err != nil {
		return fmt.Errorf("write block %d: %w", idx, err)
	}
	if err := unix.Fdatasync(int(v.f.Fd())); err != nil {
		return fmt.Errorf("fdatasync block %d: %w", idx, err)
	}
	v.last[idx] = seq
	return v.check(idx)
}

// errChecksum marks a block that reads back other than last written.
var errChecksum = errors.New("checksum")

// check reads block idx back past every cache and checks its sum and that
// it is the last one written there.
func (v *verifier) check(idx int) error {
	if _, err := v.f.ReadAt(v.buf, int64(idx)*verifyBlock); err != nil {
		return fmt.Errorf("read block %d: %w", idx, err)
	}
	sum := binary.LittleEndian.Uint32(v.buf[verifyBlock-4:])
	seq, at := binary.LittleEndian.Uint64(v.buf), binary.LittleEndian.Uint64(v.buf[8:])
	if crc32.Checksum(v.buf[:verifyBlock-4], crc32c) != sum || seq != v.last[idx] || at != uint64(idx) {
		return fmt.Errorf("%w: block %d holds sequence %d of block %d, want %d", errChecksum, idx, seq, at, v.last[idx])
	}
	return nil
}

func (v *verifier) fail(err error) {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.err = errors.Join(v.err, err)
	if errors.Is(err, errChecksum) {
		v.checksumErrors++
	} else {
		v.ioErrors++
	}
}

func (v *verifier) failure() error {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.err
}

// finish stops the writes and checks every block written.
func (v *verifier) finish(timeout time.Duration) error {
	close(v.stop)
	select {
	case <-v.done:
	case <-time.After(timeout):
		return errors.New("writer stuck: its I/O does not end")
	}
	for idx, seq := range v.last {
		if seq == 0 {
			continue
		}
		if err := v.check(idx); err != nil {
			v.fail(err)
		}
	}
	return v.failure()
}

// longestIn is the longest round that overlapped [from, to].
func (v *verifier) longestIn(from, to int64) time.Duration {
	v.mu.Lock()
	defer v.mu.Unlock()
	var longest int64
	for _, r := range v.rounds {
		if r[1] >= from && r[0] <= to {
			longest = max(longest, r[1]-r[0])
		}
	}
	return time.Duration(longest)
}
