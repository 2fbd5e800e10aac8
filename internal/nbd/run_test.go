package nbd

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/berth-io/berth/internal/blockdev/blockdevtest"
)

// fakeKernel behaves like the nbd driver towards Run: it keeps its own
// reference to each socket it takes, answers Status, takes one socket per
// dead connection on Reconfigure (silently dropping the rest, as the kernel
// does) and keeps /sys/block/nbdN/backend in a fake sysfs.
type fakeKernel struct {
	t     *testing.T
	sysfs string

	mu           sync.Mutex
	devs         map[int]*fakeDev
	connects     int
	reconfigures int
}

type fakeDev struct {
	backend  string
	size     int64
	deadConn time.Duration
	conns    []*testClient
}

func newFakeKernelDriver(t *testing.T) *fakeKernel {
	return &fakeKernel{t: t, sysfs: t.TempDir(), devs: map[int]*fakeDev{}}
}

// take is the kernel's own reference to a socket.
func (k *fakeKernel) take(f *os.File) *testClient {
	fd, err := unix.Dup(int(f.Fd()))
	if err != nil {
		k.t.Fatal(err)
	}
	if err := unix.SetNonblock(fd, true); err != nil {
		k.t.Fatal(err)
	}
	c := newTestClient(os.NewFile(uintptr(fd), "kernel"))
	k.t.Cleanup(func() { _ = c.conn.Close() })
	return c
}

func (k *fakeKernel) Connect(p ConnectParams) (int, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.connects++
	idx := 0
	for k.devs[idx] != nil {
		idx++
	}
	d := &fakeDev{backend: p.Backend, size: p.Size, deadConn: p.DeadConnTimeout}
	for _, s := range p.Socks {
		d.conns = append(d.conns, k.take(s))
	}
	k.devs[idx] = d
	writeBackend(k.t, k.sysfs, idx, p.Backend)
	return idx, nil
}

func dead(c *testClient) bool {
	select {
	case <-c.done:
		return true
	default:
		return false
	}
}

func (k *fakeKernel) Reconfigure(index int, backend string, socks []*os.File, deadConn time.Duration) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.reconfigures++
	d := k.devs[index]
	if d == nil {
		return unix.EINVAL
	}
	d.deadConn = deadConn
	next := 0
	for i, c := range d.conns {
		if next < len(socks) && dead(c) {
			d.conns[i] = k.take(socks[next])
			next++
		}
	}
	return nil
}

func (k *fakeKernel) Disconnect(index int) error {
	k.mu.Lock()
	d := k.devs[index]
	delete(k.devs, index)
	k.mu.Unlock()
	if d == nil {
		return unix.EINVAL
	}
	disc := make([]byte, requestSize)
	putRequest(disc, request{cmd: cmdDisc})
	for _, c := range d.conns {
		_ = c.sendRaw(disc)
	}
	return os.Remove(filepath.Join(k.sysfs, "block", "nbd"+itoa(index), "backend"))
}

func (k *fakeKernel) Status(index int) (bool, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.devs[index] != nil, nil
}

func (k *fakeKernel) dev(index int) *fakeDev {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.devs[index]
}

// running is one Run in a goroutine.
type running struct {
	cancel context.CancelFunc
	done   chan error
	ready  chan string
}

func startRun(t *testing.T, k *fakeKernel, image string, mod func(*RunConfig)) *running {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{cancel: cancel, done: make(chan error, 1), ready: make(chan string, 1)}
	c := RunConfig{Kernel: k, Sysfs: k.sysfs, Volume: "vol-1", Image: image, Connections: 2,
		Log: testLog(t), OnReady: func(dev string) { r.ready <- dev }}
	if mod != nil {
		mod(&c)
	}
	go func() { r.done <- Run(ctx, c) }()
	t.Cleanup(func() {
		cancel()
		<-r.done
	})
	return r
}

func (r *running) waitReady(t *testing.T) string {
	t.Helper()
	select {
	case dev := <-r.ready:
		return dev
	case err := <-r.done:
		t.Fatalf("Run ended before ready: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("Run not ready")
	}
	return ""
}

func (r *running) stop(t *testing.T) error {
	t.Helper()
	r.cancel()
	return r.ended(t, "Run did not return after its context ended")
}

// ended waits for Run to end and returns its error, left on done for
// startRun's cleanup; the test fails with stuck when Run goes on.
func (r *running) ended(t *testing.T, stuck string) error {
	t.Helper()
	select {
	case err := <-r.done:
		r.done <- err
		return err
	case <-time.After(10 * time.Second):
		t.Fatal(stuck)
	}
	return nil
}

// serving starts one Run of a 1 MiB image on a fake kernel and returns them
// and the device once it serves.
func serving(t *testing.T) (*fakeKernel, *running, *fakeDev) {
	t.Helper()
	k := newFakeKernelDriver(t)
	_, image := blockdevtest.ImageFile(t, 1<<20, false)
	r := startRun(t, k, image, nil)
	r.waitReady(t)
	return k, r, k.dev(0)
}

func TestRunConnectReconnectDisconnect(t *testing.T) {
	k := newFakeKernelDriver(t)
	_, image := blockdevtest.ImageFile(t, 8<<20, false)

	first := startRun(t, k, image, nil)
	if dev := first.waitReady(t); dev != "/dev/nbd0" {
		t.Fatalf("device %q", dev)
	}
	d := k.dev(0)
	if d.backend != "berth:vol-1" || d.size != 8<<20 || d.deadConn != DefaultDeadConnTimeout || len(d.conns) != 2 {
		t.Fatalf("connected with %+v", d)
	}
	data := bytes.Repeat([]byte("berth"), 1000)
	mustDo(t, d.conns[0], cmdWrite, cmdFlagFUA, 4096, uint32(len(data)), data)
	if got := mustDo(t, d.conns[1], cmdRead, 0, 4096, uint32(len(data)), nil); !bytes.Equal(got, data) {
		t.Fatal("read on the second connection differs")
	}

	// The server goes away: the device stays, its connections die.
	if err := first.stop(t); err != nil {
		t.Fatalf("Run after its context ended: %v", err)
	}
	for i, c := range d.conns {
		select {
		case <-c.done:
		case <-time.After(5 * time.Second):
			t.Fatalf("connection %d still open after the server stopped", i)
		}
	}
	if k.dev(0) == nil {
		t.Fatal("device gone after the server stopped")
	}

	// The next server finds the device and reconnects.
	second := startRun(t, k, image, func(c *RunConfig) { c.DeadConnTimeout = time.Minute })
	if dev := second.waitReady(t); dev != "/dev/nbd0" {
		t.Fatalf("device after reconnect %q", dev)
	}
	if k.connects != 1 || k.reconfigures != 1 || d.deadConn != time.Minute {
		t.Fatalf("connects %d reconfigures %d deadConn %s", k.connects, k.reconfigures, d.deadConn)
	}
	for i, c := range k.dev(0).conns {
		if got := mustDo(t, c, cmdRead, 0, 4096, uint32(len(data)), nil); !bytes.Equal(got, data) {
			t.Fatalf("connection %d after reconnect: data differs", i)
		}
	}

	// A third server while the second is alive gets no connection.
	third := startRun(t, k, image, func(c *RunConfig) { c.ReconnectWait = 300 * time.Millisecond })
	if err := third.ended(t, "third server did not give up"); err == nil || !strings.Contains(err.Error(), "no dead connection") {
		t.Fatalf("third server: %v", err)
	}

	// Disconnect: the kernel sends DISC, the server ends cleanly.
	if err := k.Disconnect(0); err != nil {
		t.Fatal(err)
	}
	if err := second.ended(t, "Run did not end after disconnect"); err != nil {
		t.Fatalf("Run after disconnect: %v", err)
	}
}

// The kernel drops a connection whose request outlived the request timer
// (several connections, nbd_xmit_timeout) and keeps the device: Run hands
// it a fresh socket for the dead slot and goes on serving.
func TestRunReplacesConnectionTheKernelDropped(t *testing.T) {
	k, r, d := serving(t)
	dropped := d.conns[1]
	_ = dropped.conn.Close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		k.mu.Lock()
		replaced := d.conns[1] != dropped
		k.mu.Unlock()
		if replaced {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the dropped connection was not replaced")
		}
		time.Sleep(20 * time.Millisecond)
	}
	data := bytes.Repeat([]byte{5}, 4096)
	mustDo(t, k.dev(0).conns[1], cmdWrite, 0, 0, 4096, data)
	if got := mustDo(t, k.dev(0).conns[0], cmdRead, 0, 0, 4096, nil); !bytes.Equal(got, data) {
		t.Fatal("the replacement connection does not serve the image")
	}
	select {
	case err := <-r.done:
		t.Fatalf("Run ended: %v", err)
	default:
	}
}

// Every connection lost and the device gone (nothing to reconnect to) ends
// Run with ErrDisconnected, so that a supervisor sees it.
func TestRunAllConnectionsLost(t *testing.T) {
	k, r, d := serving(t)
	k.mu.Lock()
	delete(k.devs, 0)
	k.mu.Unlock()
	for _, c := range d.conns {
		_ = c.conn.Close()
	}
	if err := r.ended(t, "Run did not end"); !errors.Is(err, ErrDisconnected) {
		t.Fatalf("Run: %v, want ErrDisconnected", err)
	}
}

func TestRunRefusesBadConfig(t *testing.T) {
	k := newFakeKernelDriver(t)
	_, image := blockdevtest.ImageFile(t, 1<<20, false)
	for name, mod := range map[string]func(*RunConfig){
		"no kernel":         func(c *RunConfig) { c.Kernel = nil },
		"no volume":         func(c *RunConfig) { c.Volume = "" },
		"too many conns":    func(c *RunConfig) { c.Connections = 99 },
		"tiny dead timeout": func(c *RunConfig) { c.DeadConnTimeout = time.Millisecond },
		"missing image":     func(c *RunConfig) { c.Image = filepath.Join(t.TempDir(), "none") },
	} {
		c := RunConfig{Kernel: k, Sysfs: k.sysfs, Volume: "v", Image: image, Log: testLog(t)}
		mod(&c)
		if err := Run(context.Background(), c); err == nil {
			t.Fatalf("%s: Run accepted it", name)
		}
	}
	if k.connects != 0 {
		t.Fatal("a refused Run connected a device")
	}
}

// A socket the kernel did not keep shows a hang-up on our end once our copy
// of its end is closed; one it kept does not.
func TestPairsTaken(t *testing.T) {
	p, err := newPairs(3)
	if err != nil {
		t.Fatal(err)
	}
	kept, err := unix.Dup(int(p.kernel()[1].Fd()))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = unix.Close(kept) }()
	ours := p.ours()
	p.closeKernel()
	taken := p.taken()
	if len(taken) != 1 || taken[0] != ours[1] {
		t.Fatalf("taken %v, want only the second socket", taken)
	}
	_ = taken[0].Close()
}
