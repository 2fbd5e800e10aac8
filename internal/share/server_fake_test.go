package share

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/berth-io/berth/internal/testenv"
)

// fakeExec starts fakeProcs; the real path is the root test in
// internal/cli/sharemanager.
type fakeExec struct {
	noPidFile, ignoreTerm bool
	mu                    sync.Mutex
	procs                 []*fakeProc
	args                  []string
}

func (f *fakeExec) Start(name string, args []string, _ io.Writer) (Process, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.args = append([]string{name}, args...)
	if !f.noPidFile {
		i := slices.Index(args, "-p")
		if err := os.WriteFile(args[i+1], []byte("4242\n"), 0o600); err != nil {
			return nil, err
		}
	}
	p := &fakeProc{exited: make(chan struct{}), ignoreTerm: f.ignoreTerm}
	f.procs = append(f.procs, p)
	return p, nil
}

type fakeProc struct {
	ignoreTerm bool
	once       sync.Once
	exited     chan struct{}
	mu         sync.Mutex
	signals    []os.Signal
}

func (p *fakeProc) Pid() int { return 4242 }
func (p *fakeProc) Signal(sig os.Signal) error {
	p.mu.Lock()
	p.signals = append(p.signals, sig)
	p.mu.Unlock()
	if sig == syscall.SIGKILL || !p.ignoreTerm {
		p.exit()
	}
	return nil
}
func (p *fakeProc) exit() { p.once.Do(func() { close(p.exited) }) }
func (p *fakeProc) Wait() error {
	<-p.exited
	return errors.New("signal: killed")
}
func (p *fakeProc) got() []os.Signal {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.signals)
}

// runFake runs a Server on a fake clock that advances 50 ms every real
// millisecond, so that timeouts of seconds pass in a blink.
func runFake(t *testing.T, ctx context.Context, e *fakeExec, checks Checks, ready func()) error {
	t.Helper()
	clk := clocktesting.NewFakeClock(time.Now())
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		for {
			select {
			case <-stop:
				return
			case <-time.After(time.Millisecond):
				clk.Step(50 * time.Millisecond)
			}
		}
	}()
	dir := t.TempDir()
	port := testenv.FreePort(t)
	cfg := ServerConfig{
		Export:           ExportConfig{Path: "/export", Pseudo: "/pv1", RecoveryRoot: filepath.Join(dir, "rec"), BindAddr: "127.0.0.1", Port: port},
		Dir:              filepath.Join(dir, "state"),
		FailureThreshold: 2,
	}
	return NewServer(cfg, e, clk, checks, testr.New(t)).Run(ctx, ready)
}

func ok(context.Context) error { return nil }

func TestServerReadyThenStopsOnCancel(t *testing.T) {
	e := &fakeExec{}
	ctx, cancel := context.WithCancel(context.Background())
	var ready atomic.Bool
	err := runFake(t, ctx, e, Checks{Device: ok, Export: ok}, func() { ready.Store(true); cancel() })
	if err != nil {
		t.Fatalf("Run = %v, want nil after cancel", err)
	}
	if !ready.Load() {
		t.Fatal("never ready")
	}
	if got := e.procs[0].got(); !slices.Equal(got, []os.Signal{syscall.SIGTERM}) {
		t.Errorf("signals = %v, want SIGTERM", got)
	}
	if e.args[0] != "ganesha.nfsd" || !slices.Contains(e.args, "-F") {
		t.Errorf("args = %v", e.args)
	}
}

func TestServerFailsWhenGaneshaExits(t *testing.T) {
	e := &fakeExec{}
	err := runFake(t, context.Background(), e, Checks{Device: ok, Export: ok}, func() { e.procs[0].exit() })
	if !errors.Is(err, ErrFailed) {
		t.Fatalf("Run = %v, want ErrFailed", err)
	}
}

func TestServerFailsAfterFailedChecks(t *testing.T) {
	e := &fakeExec{}
	var readyOnce atomic.Bool
	dev := func(context.Context) error {
		if readyOnce.Load() {
			return errors.New("device gone")
		}
		return nil
	}
	err := runFake(t, context.Background(), e, Checks{Device: dev, Export: ok}, func() { readyOnce.Store(true) })
	if !errors.Is(err, ErrFailed) {
		t.Fatalf("Run = %v, want ErrFailed", err)
	}
	if got := e.procs[0].got(); !slices.Contains(got, os.Signal(syscall.SIGTERM)) {
		t.Errorf("ganesha not stopped after failing: signals %v", got)
	}
}

func TestServerCheckThatHangsCountsAsFailed(t *testing.T) {
	e := &fakeExec{}
	var isReady atomic.Bool
	hang := func(ctx context.Context) error {
		if isReady.Load() {
			select {} // a read from a dead device
		}
		return nil
	}
	err := runFake(t, context.Background(), e, Checks{Device: hang, Export: ok}, func() { isReady.Store(true) })
	if !errors.Is(err, ErrFailed) {
		t.Fatalf("Run = %v, want ErrFailed", err)
	}
}

func TestServerNotReadyInTime(t *testing.T) {
	e := &fakeExec{noPidFile: true}
	err := runFake(t, context.Background(), e, Checks{Device: ok, Export: ok}, func() { t.Error("ready without a pid file") })
	if !errors.Is(err, ErrFailed) {
		t.Fatalf("Run = %v, want ErrFailed", err)
	}
}

func TestServerKillsGaneshaThatIgnoresTerm(t *testing.T) {
	e := &fakeExec{ignoreTerm: true}
	ctx, cancel := context.WithCancel(context.Background())
	if err := runFake(t, ctx, e, Checks{Device: ok, Export: ok}, cancel); err != nil {
		t.Fatal(err)
	}
	if got := e.procs[0].got(); !slices.Equal(got, []os.Signal{syscall.SIGTERM, syscall.SIGKILL}) {
		t.Errorf("signals = %v, want SIGTERM then SIGKILL", got)
	}
}

// A server whose Lease is lost is killed at once, not asked to stop.
func TestServerKilledAtOnceWhenTheLeaseIsLost(t *testing.T) {
	e := &fakeExec{}
	ctx, cancel := context.WithCancelCause(context.Background())
	err := runFake(t, ctx, e, Checks{Device: ok, Export: ok}, func() { cancel(fmt.Errorf("%w: not renewed for 10s", ErrLeaseLost)) })
	if err != nil {
		t.Fatalf("Run = %v, want nil after cancel", err)
	}
	if got := e.procs[0].got(); len(got) == 0 || got[0] != syscall.SIGKILL {
		t.Errorf("signals = %v, want SIGKILL first", got)
	}
}
