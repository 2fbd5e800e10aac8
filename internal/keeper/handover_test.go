package keeper_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"golang.org/x/sys/unix"

	"github.com/berth-io/berth/internal/keeper"
)

// serving is a Service serving its listener, as a keeper process does.
type serving struct {
	svc    *keeper.Service
	sock   string
	stop   context.CancelFunc
	ended  chan struct{}
	result error
}

// serveOn serves svc on l until the test ends (or a hand-over ends it).
func serveOn(t *testing.T, svc *keeper.Service, l *net.UnixListener, sock string) *serving {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	s := &serving{svc: svc, sock: sock, stop: cancel, ended: make(chan struct{})}
	go func() { s.result = svc.Serve(ctx, l); close(s.ended) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-s.ended:
		case <-time.After(15 * time.Second):
			t.Error("Serve did not return")
		}
	})
	return s
}

// oldKeeper serves a keeper over k with vols open (its servers are this
// process) and INIT settings saved for the first.
func oldKeeper(t *testing.T, k keeper.Kernel, vols ...string) *serving {
	t.Helper()
	l, sock := listenRoot(t)
	s := serveOn(t, keeper.New(k, logr.Discard()), l, sock)
	c := keeper.NewClient(sock)
	for i, v := range vols {
		conn, err := c.Open(context.Background(), v, "/mnt/"+v)
		if err != nil {
			t.Fatal(err)
		}
		_ = conn.File.Close()
		if i == 0 {
			if err := c.SaveInit(context.Background(), v, []byte(`{"out":{"major":7}}`)); err != nil {
				t.Fatal(err)
			}
		}
	}
	return s
}

// takeOver starts a new keeper on s's socket and serves it.
func takeOver(t *testing.T, k keeper.Kernel, s *serving) *serving {
	t.Helper()
	svc := keeper.New(k, logr.Discard())
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	l, err := svc.Start(ctx, s.sock)
	if err != nil {
		t.Fatalf("take over: %v", err)
	}
	return serveOn(t, svc, l, s.sock)
}

func (s *serving) waitEnded(t *testing.T) {
	t.Helper()
	select {
	case <-s.ended:
		if s.result != nil {
			t.Fatalf("Serve: %v", s.result)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the old keeper still serves after the hand-over")
	}
}

func fdInode(t *testing.T, f *os.File) uint64 {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		t.Fatal(err)
	}
	return st.Ino
}

// TestHandOverSeveralVolumes: a new keeper takes every connection (the
// same file descriptions), their settings, servers and the socket; the old
// one stops, having unmounted nothing, and the socket path still serves.
func TestHandOverSeveralVolumes(t *testing.T) {
	k := newFakeKernel()
	old := oldKeeper(t, k, "vol1", "vol2", "vol3")
	ctx := context.Background()
	c := keeper.NewClient(old.sock)
	before, err := c.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := c.Get(ctx, "vol1")
	if err != nil {
		t.Fatal(err)
	}
	ino := fdInode(t, conn.File)
	_ = conn.File.Close()

	newer := takeOver(t, k, old)
	old.waitEnded(t)
	if n, ok := old.svc.HandedOver(); !ok || n != 3 || len(old.svc.Held()) != 0 {
		t.Fatalf("old keeper: handed over %d (%v), holds %v; want 3 and nothing", n, ok, old.svc.Held())
	}
	after, err := c.List(ctx)
	if err != nil || fmt.Sprint(after) != fmt.Sprint(before) {
		t.Fatalf("List after = %+v, %v; want %+v", after, err, before)
	}
	if n, ok := newer.svc.HandedOver(); ok {
		t.Fatalf("the new keeper says it handed over %d", n)
	}
	conn, err = c.Get(ctx, "vol1")
	if err != nil {
		t.Fatal(err)
	}
	defer conn.File.Close()
	if fdInode(t, conn.File) != ino || string(conn.Settings) != `{"out":{"major":7}}` {
		t.Fatalf("vol1 after the hand-over: another connection or settings %q", conn.Settings)
	}
	if mounts, _, unmounts := k.counts(); unmounts != 0 || mounts != 3 {
		t.Fatalf("hand-over unmounted: %d unmounts, %d mounts left", unmounts, mounts)
	}
	// The new keeper serves everything, the same server still counts.
	if _, err := c.Open(ctx, "vol4", "/mnt/vol4"); err != nil {
		t.Fatal(err)
	}
	if err := c.Close(ctx, "vol3"); err != nil {
		t.Fatal(err)
	}
	if vols, _ := c.List(ctx); len(vols) != 3 || vols[2].Name != "vol4" {
		t.Fatalf("after open and close on the new keeper: %+v", vols)
	}
}

// TestHandOverPastTwoHundredFDs: 150 volumes with servers are 301 fds,
// more than one message may carry.
func TestHandOverPastTwoHundredFDs(t *testing.T) {
	k := newFakeKernel()
	var vols []string
	for i := range 150 {
		vols = append(vols, fmt.Sprintf("pvc-%03d", i))
	}
	old := oldKeeper(t, k, vols...)
	takeOver(t, k, old)
	old.waitEnded(t)
	got, err := keeper.NewClient(old.sock).List(context.Background())
	if err != nil || len(got) != 150 {
		t.Fatalf("List = %d volumes, %v; want 150", len(got), err)
	}
	for _, v := range got {
		if v.ServerPID != os.Getpid() {
			t.Fatalf("%s lost its server: %+v", v.Name, v)
		}
	}
}

// rawHandOver asks the keeper at sock for a hand-over as a new keeper
// would, with deadline (0: none), and reads its parts; it does not ack.
func rawHandOver(t *testing.T, sock string, deadline time.Time) (*net.UnixConn, []string) {
	t.Helper()
	nc, err := net.Dial("unixpacket", sock)
	if err != nil {
		t.Fatal(err)
	}
	c := nc.(*net.UnixConn)
	t.Cleanup(func() { _ = c.Close() })
	req := map[string]any{"op": keeper.OpHandOver}
	if !deadline.IsZero() {
		req["deadline"] = deadline.UnixNano()
	}
	b, _ := json.Marshal(req)
	if _, err := c.Write(b); err != nil {
		t.Fatal(err)
	}
	var parts []string
	for {
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		buf, oob := make([]byte, 1<<20), make([]byte, 4096)
		n, oobn, _, _, err := c.ReadMsgUnix(buf, oob)
		if err != nil {
			t.Fatal(err)
		}
		msgs, _ := unix.ParseSocketControlMessage(oob[:oobn])
		for _, m := range msgs {
			fds, _ := unix.ParseUnixRights(&m)
			for _, fd := range fds {
				_ = unix.Close(fd)
			}
		}
		parts = append(parts, string(buf[:n]))
		if strings.Contains(string(buf[:n]), `"last":true`) || strings.Contains(string(buf[:n]), `"error"`) {
			return c, parts
		}
	}
}

// TestHandOverNewKeeperDies: while a hand-over is in progress, requests
// that change the table are refused (and retried by clients), others are
// answered; when the new keeper dies before its ack, the old one serves on
// and can still hand over.
func TestHandOverNewKeeperDies(t *testing.T) {
	k := newFakeKernel()
	old := oldKeeper(t, k, "vol1", "vol2")
	c := keeper.NewClient(old.sock)
	conn, parts := rawHandOver(t, old.sock, time.Time{})
	if len(parts) != 1 || !strings.Contains(parts[0], `"total":2`) {
		t.Fatalf("parts = %q", parts)
	}
	short, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	if _, err := c.Open(short, "vol3", "/mnt/vol3"); !errors.Is(err, keeper.ErrHandingOver) || !errors.Is(err, keeper.ErrBusy) {
		t.Fatalf("open during a hand-over: %v, want ErrHandingOver (a kind of ErrBusy)", err)
	}
	if vols, err := c.List(context.Background()); err != nil || len(vols) != 2 {
		t.Fatalf("list during a hand-over: %+v, %v", vols, err)
	}
	if _, err := keeper.NewClient(old.sock).Serving(context.Background()); err != nil {
		t.Fatalf("ping during a hand-over: %v", err)
	}
	// A client waiting meanwhile gets its answer once the old keeper
	// serves on.
	opened := make(chan error, 1)
	go func() {
		conn, err := c.Open(context.Background(), "vol3", "/mnt/vol3")
		if err == nil {
			_ = conn.File.Close()
		}
		opened <- err
	}()
	time.Sleep(100 * time.Millisecond)
	_ = conn.Close() // the new keeper dies
	if err := <-opened; err != nil {
		t.Fatalf("open after the new keeper died: %v", err)
	}
	if _, ok := old.svc.HandedOver(); ok || len(old.svc.Held()) != 3 {
		t.Fatalf("old keeper after a failed hand-over holds %v", old.svc.Held())
	}
	takeOver(t, k, old)
	old.waitEnded(t)
}

// TestClientRidesThroughAHandOver: a hand-over waits for the operation in
// progress (a mount that hangs a while); an open asked meanwhile is
// refused, asked again by the client, and answered by the new keeper,
// which also holds what the hanging open made.
func TestClientRidesThroughAHandOver(t *testing.T) {
	k := &hangKernel{fakeKernel: newFakeKernel(), hang: "/mnt/hang", release: make(chan struct{})}
	old := oldKeeper(t, k, "vol1")
	c := keeper.NewClient(old.sock)
	opened := func(volume string, done chan<- error) {
		conn, err := c.Open(context.Background(), volume, "/mnt/"+volume)
		if err == nil {
			_ = conn.File.Close()
		}
		done <- err
	}
	hung, asked := make(chan error, 1), make(chan error, 1)
	go opened("hang", hung)
	time.Sleep(100 * time.Millisecond)
	taken := make(chan *net.UnixListener, 1)
	svc := keeper.New(k, logr.Discard())
	go func() {
		l, err := svc.Start(context.Background(), old.sock)
		if err != nil {
			t.Errorf("take over: %v", err)
		}
		taken <- l
	}()
	time.Sleep(100 * time.Millisecond)
	go opened("vol2", asked)
	time.Sleep(100 * time.Millisecond)
	select {
	case err := <-asked:
		t.Fatalf("open answered while the hand-over waits: %v", err)
	default:
	}
	close(k.release)
	if err := <-hung; err != nil {
		t.Fatalf("the open the hand-over waited for: %v", err)
	}
	l := <-taken
	if l == nil {
		t.FailNow()
	}
	serveOn(t, svc, l, old.sock)
	if err := <-asked; err != nil {
		t.Fatalf("open asked during the hand-over: %v", err)
	}
	old.waitEnded(t)
	if vols := svc.Held(); len(vols) != 3 {
		t.Fatalf("the new keeper holds %+v, want vol1, hang and vol2", vols)
	}
}

// TestHandOverAckTooLate: an ack after the deadline commits nothing; the
// new keeper gets no confirmation and the old one serves on.
func TestHandOverAckTooLate(t *testing.T) {
	k := newFakeKernel()
	old := oldKeeper(t, k, "vol1")
	conn, _ := rawHandOver(t, old.sock, time.Now().Add(200*time.Millisecond))
	time.Sleep(400 * time.Millisecond)
	b, _ := json.Marshal(map[string]any{"op": keeper.OpHandedOver, "count": 1})
	_, _ = conn.Write(b)
	_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, 4096)
	if n, err := conn.Read(buf); err == nil && n > 0 {
		t.Fatalf("late ack answered %q", buf[:n])
	}
	if _, err := keeper.NewClient(old.sock).Open(context.Background(), "vol2", "/mnt/vol2"); err != nil {
		t.Fatalf("old keeper after a late ack: %v", err)
	}
	if _, ok := old.svc.HandedOver(); ok {
		t.Fatal("a late ack handed over")
	}
}

// dialAs sends msg to sock from a thread whose effective uid is uid and
// returns the reply: the peer credentials the keeper reads are that
// thread's. The thread is never unlocked, so it ends with its goroutine.
func dialAs(uid int, sock string, msg []byte) ([]byte, error) {
	type result struct {
		b   []byte
		err error
	}
	done := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		if _, _, e := unix.RawSyscall(unix.SYS_SETRESUID, ^uintptr(0), uintptr(uid), ^uintptr(0)); e != 0 {
			done <- result{err: e}
			return
		}
		fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			done <- result{err: err}
			return
		}
		defer unix.Close(fd)
		_ = unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &unix.Timeval{Sec: 5})
		if err := unix.Connect(fd, &unix.SockaddrUnix{Name: sock}); err != nil {
			done <- result{err: err}
			return
		}
		if _, err := unix.Write(fd, msg); err != nil {
			done <- result{err: err}
			return
		}
		buf := make([]byte, 4096)
		n, err := unix.Read(fd, buf)
		done <- result{b: buf[:max(n, 0)], err: err}
	}()
	r := <-done
	return r.b, r.err
}

// TestHandOverToNonRootRefused: a process that is not root gets nothing,
// however it reaches the socket.
func TestHandOverToNonRootRefused(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to act as another user")
	}
	k := newFakeKernel()
	// Not t.TempDir(): its parent is closed to other users.
	dir, err := os.MkdirTemp("", "keeper-open-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(dir, "open.sock")
	l, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: sock, Net: "unixpacket"})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(sock, 0o666); err != nil {
		t.Fatal(err)
	}
	old := serveOn(t, keeper.New(k, logr.Discard()), l, sock)
	conn, err := keeper.NewClient(sock).Open(context.Background(), "vol1", "/mnt/vol1")
	if err != nil {
		t.Fatal(err)
	}
	_ = conn.File.Close()
	b, _ := json.Marshal(map[string]any{"op": keeper.OpHandOver})
	reply, err := dialAs(65534, sock, b)
	// Closed unread, the connection is reset, or closed before the
	// request is written: no reply either way.
	if len(reply) != 0 || (err != nil && !errors.Is(err, unix.ECONNRESET) && !errors.Is(err, unix.EPIPE)) {
		t.Fatalf("hand-over to uid 65534: reply %q, %v; want the connection closed unanswered", reply, err)
	}
	if _, ok := old.svc.HandedOver(); ok || len(old.svc.Held()) != 1 {
		t.Fatalf("after a non-root hand-over request the keeper holds %v", old.svc.Held())
	}
	if _, err := keeper.NewClient(sock).Serving(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// fakeOldKeeper answers one hand-over at sock with reply and the fds fds
// makes (it closes its copies), then reports whether an ack came.
func fakeOldKeeper(t *testing.T, sock string, reply string, fds func(l *net.UnixListener) []int) <-chan bool {
	t.Helper()
	l, err := keeper.Listen(sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
	var (
		oob    []byte
		passed []int
	)
	if fds != nil {
		passed = fds(l)
		oob = unix.UnixRights(passed...)
	}
	acked := make(chan bool, 1)
	go func() {
		defer closeAll(passed)
		c, err := l.AcceptUnix()
		if err != nil {
			acked <- false
			return
		}
		buf := make([]byte, 4096)
		_, _ = c.Read(buf)
		_, _, _ = c.WriteMsgUnix([]byte(reply), oob, nil)
		closeAll(passed)
		passed = nil
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
		n, _ := c.Read(buf)
		_ = c.Close()
		acked <- strings.Contains(string(buf[:n]), keeper.OpHandedOver)
	}()
	return acked
}

func closeAll(fds []int) {
	for _, fd := range fds {
		_ = unix.Close(fd)
	}
}

func openFDs(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(ents)
}

// TestTakeOverRefusesBadData: what a new keeper cannot check fails its
// start with a clear error, before any ack, and leaves no fd behind.
func TestTakeOverRefusesBadData(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("the hand-over checks its peer is root; run as root")
	}
	listenerFD := func(l *net.UnixListener) int {
		rc, err := l.SyscallConn()
		if err != nil {
			t.Fatal(err)
		}
		var dup int
		_ = rc.Control(func(fd uintptr) { dup, err = unix.FcntlInt(fd, unix.F_DUPFD_CLOEXEC, 0) })
		if err != nil {
			t.Fatal(err)
		}
		return dup
	}
	pipe := func() int {
		fd, _, err := pipeFD()
		if err != nil {
			t.Fatal(err)
		}
		return fd
	}
	fuseAndListener := func(l *net.UnixListener) []int { return []int{pipe(), listenerFD(l)} }
	vol := func(name, mp string) string {
		return fmt.Sprintf(`{"held":[{"name":%q,"mountpoint":%q}],"total":1,"last":true}`, name, mp)
	}
	for _, tc := range []struct {
		name, reply string
		fds         func(*net.UnixListener) []int
		kernel      func(*fakeKernel)
		want        string
	}{
		{"bad name", vol("../x", "/mnt/x"), fuseAndListener, nil, "../x"},
		{"unclean mountpoint", vol("vol1", "/mnt/../x"), fuseAndListener, nil, "clean absolute path"},
		{"not mounted", vol("vol1", "/mnt/gone"), fuseAndListener, nil, "not mounted"},
		{"not FUSE", vol("vol1", "/mnt/vol1"), fuseAndListener, func(k *fakeKernel) { k.fuseErr = errors.New("not /dev/fuse") }, "not /dev/fuse"},
		{"fds missing", vol("vol1", "/mnt/vol1"), func(l *net.UnixListener) []int { return []int{listenerFD(l)} }, nil, "want 2"},
		{"total wrong", `{"held":[],"total":3,"last":true}`, func(l *net.UnixListener) []int { return []int{listenerFD(l)} }, nil, "announced 3"},
		{"no listener", `{"held":[],"total":0,"last":true}`, func(*net.UnixListener) []int { return []int{pipe()} }, nil, "SOCK_SEQPACKET"},
		{"not JSON", `{"held":`, nil, nil, "hand-over message"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			k := newFakeKernel()
			k.mounts["/mnt/vol1"] = 0
			k.mounts["/mnt/x"] = 0
			if tc.kernel != nil {
				tc.kernel(k)
			}
			sock := filepath.Join(t.TempDir(), "keeper.sock")
			acked := fakeOldKeeper(t, sock, tc.reply, tc.fds)
			fds := openFDs(t)
			svc := keeper.New(k, logr.Discard())
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			l, err := svc.Start(ctx, sock)
			if err == nil {
				_ = l.Close()
				t.Fatal("took over bad data")
			}
			if !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), sock) {
				t.Errorf("error %q does not say %q and name the socket", err, tc.want)
			}
			if <-acked {
				t.Error("acked bad data")
			}
			if len(svc.Held()) != 0 {
				t.Errorf("holds %v", svc.Held())
			}
			if now := openFDs(t); now > fds {
				t.Errorf("%d fds open after a refused hand-over, %d before", now, fds)
			}
		})
	}
}

// TestStartWaitsForAnOlderKeeper: a keeper from before hand-overs answers
// "unknown op"; the new one waits until it is gone, then listens.
func TestStartWaitsForAnOlderKeeper(t *testing.T) {
	sock, l := olderKeeper(t, func(string) string {
		return `{"error":"invalid request: unknown op \"hand-over\"","code":"invalid"}`
	})
	started := make(chan error, 1)
	svc := keeper.New(newFakeKernel(), logr.Discard())
	var nl *net.UnixListener
	go func() {
		var err error
		nl, err = svc.Start(context.Background(), sock)
		started <- err
	}()
	select {
	case err := <-started:
		t.Fatalf("started beside a keeper that cannot hand over: %v", err)
	case <-time.After(1500 * time.Millisecond):
	}
	_ = l.Close()
	select {
	case err := <-started:
		if err != nil {
			t.Fatal(err)
		}
		_ = nl.Close()
	case <-time.After(5 * time.Second):
		t.Fatal("still waiting after the older keeper exited")
	}
}

// TestStopServesOnForAHandOver: a keeper told to stop while it holds
// connections serves on for HandOverWait; a new keeper taking over then
// ends it. With nothing taking over it stops after the wait, holding what
// it held (its exit is what drops them); holding nothing, at once.
func TestStopServesOnForAHandOver(t *testing.T) {
	k := newFakeKernel()
	stopped := func(s *serving, within time.Duration) bool {
		select {
		case <-s.ended:
			return true
		case <-time.After(within):
			return false
		}
	}
	start := func(wait time.Duration, vols ...string) *serving {
		s := oldKeeper(t, k, vols...)
		s.svc.HandOverWait = wait
		return s
	}

	old := start(time.Minute, "a1")
	old.stop()
	if stopped(old, 300*time.Millisecond) {
		t.Fatal("stopped at once while holding a connection")
	}
	if _, err := keeper.NewClient(old.sock).Open(context.Background(), "a2", "/mnt/a2"); err != nil {
		t.Fatalf("serving on after the stop: %v", err)
	}
	takeOver(t, k, old)
	if !stopped(old, 5*time.Second) {
		t.Fatal("still serving after the hand-over")
	}
	if n, ok := old.svc.HandedOver(); !ok || n != 2 {
		t.Fatalf("handed over %d, %v", n, ok)
	}

	lone := start(300*time.Millisecond, "b1")
	lone.stop()
	if !stopped(lone, 5*time.Second) || len(lone.svc.Held()) != 1 {
		t.Fatalf("no hand-over: stopped %v holding %v", stopped(lone, 0), lone.svc.Held())
	}

	empty := start(time.Minute)
	empty.stop()
	if !stopped(empty, time.Second) {
		t.Fatal("a keeper holding nothing did not stop at once")
	}
}

// TestHostKernelChecksPassedFDs: the real checks tell /dev/fuse and a
// pidfd from a pipe.
func TestHostKernelChecksPassedFDs(t *testing.T) {
	fuse, err := keeper.HostKernel{}.OpenFUSE()
	if err != nil {
		t.Skipf("needs /dev/fuse (root): %v", err)
	}
	defer unix.Close(fuse)
	pipe, _, err := pipeFD()
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(pipe)
	k := keeper.HostKernel{}
	if err := k.CheckFUSE(fuse); err != nil {
		t.Errorf("CheckFUSE(/dev/fuse): %v", err)
	}
	if err := k.CheckFUSE(pipe); err == nil {
		t.Error("CheckFUSE took a pipe")
	}
	if _, _, err := k.AdoptProcess(pipe); err == nil {
		t.Error("AdoptProcess took a pipe")
	}
	pidfd, err := unix.PidfdOpen(os.Getpid(), 0)
	if err != nil {
		t.Fatal(err)
	}
	p, pid, err := k.AdoptProcess(pidfd)
	if err != nil || pid != int32(os.Getpid()) || !p.Alive() || p.FD() != pidfd {
		t.Fatalf("AdoptProcess(own pidfd) = pid %d, %v", pid, err)
	}
	p.Release()
}
