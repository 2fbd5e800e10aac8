package share

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/utils/clock"

	"github.com/berth-io/berth/internal/atomicfile"
)

// Check is one health check; it must return when ctx ends.
type Check func(ctx context.Context) error

// ServerConfig is one ganesha server over one mounted volume.
type ServerConfig struct {
	Export ExportConfig
	// Dir holds the config, pid file and log (a per-pod emptyDir).
	Dir string
	// Ganesha is the ganesha.nfsd binary (default "ganesha.nfsd").
	Ganesha string
	// StartTimeout bounds the start: pid file written and export answering.
	StartTimeout time.Duration
	// CheckInterval is the time between health checks after the start,
	// CheckTimeout bounds one check; FailureThreshold checks in a row
	// must fail before the server gives up.
	CheckInterval, CheckTimeout time.Duration
	FailureThreshold            int
	// StopTimeout is how long ganesha gets after SIGTERM before SIGKILL.
	StopTimeout time.Duration
}

func (c ServerConfig) withDefaults() ServerConfig {
	if c.Ganesha == "" {
		c.Ganesha = "ganesha.nfsd"
	}
	if c.StartTimeout == 0 {
		c.StartTimeout = 30 * time.Second
	}
	if c.CheckInterval == 0 {
		c.CheckInterval = 5 * time.Second
	}
	if c.CheckTimeout == 0 {
		c.CheckTimeout = 5 * time.Second
	}
	if c.FailureThreshold == 0 {
		c.FailureThreshold = 3
	}
	if c.StopTimeout == 0 {
		c.StopTimeout = 10 * time.Second
	}
	return c
}

// Paths of the files the server keeps in Dir.
func (c ServerConfig) ConfigFile() string { return filepath.Join(c.Dir, "ganesha.conf") }
func (c ServerConfig) PidFile() string    { return filepath.Join(c.Dir, "ganesha.pid") }
func (c ServerConfig) LogFile() string    { return filepath.Join(c.Dir, "ganesha.log") }

// Checks are what the server watches besides its child.
type Checks struct {
	// Device fails when the volume's device or mount is gone or broken.
	Device Check
	// Export fails when the export does not answer an NFS client.
	Export Check
}

// Server runs ganesha as a child and watches it.
type Server struct {
	cfg    ServerConfig
	exec   Exec
	clk    clock.WithTicker
	checks Checks
	log    logr.Logger

	// mu guards clients and proc: SetClients runs beside Run.
	mu      sync.Mutex
	clients []string
	proc    Process
}

// NewServer returns a server that starts ganesha through e and times its
// checks on clk.
func NewServer(cfg ServerConfig, e Exec, clk clock.WithTicker, checks Checks, log logr.Logger) *Server {
	return &Server{cfg: cfg.withDefaults(), exec: e, clk: clk, checks: checks, log: log, clients: slices.Clone(cfg.Export.Clients)}
}

// SetClients changes the clients the export admits. A running ganesha
// rereads its exports on SIGHUP, keeping its clients' state: no restart,
// so no grace period. Before Run starts ganesha, the list is what it
// starts with. An unchanged list costs nothing.
func (s *Server) SetClients(clients []string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	ec := s.cfg.Export
	ec.Clients = clients
	conf, err := ec.Render()
	if err != nil {
		return err
	}
	old := s.cfg.Export
	old.Clients = s.clients
	if prev, err := old.Render(); err == nil && prev == conf {
		return nil
	}
	s.clients = slices.Clone(clients)
	if s.proc == nil {
		return nil
	}
	// Atomic: ganesha must never reread half a file.
	if err := atomicfile.Write(s.cfg.ConfigFile(), []byte(conf), 0o600); err != nil {
		return fmt.Errorf("write %s: %w", s.cfg.ConfigFile(), err)
	}
	if err := s.proc.Signal(syscall.SIGHUP); err != nil {
		return fmt.Errorf("tell ganesha %d to reread its exports: %w", s.proc.Pid(), err)
	}
	s.log.Info("export clients changed", "clients", ec.clients(), "pid", s.proc.Pid())
	return nil
}

// export is the export as it stands, with the clients set last.
func (s *Server) export() ExportConfig {
	s.mu.Lock()
	defer s.mu.Unlock()
	ec := s.cfg.Export
	ec.Clients = slices.Clone(s.clients)
	return ec
}

// ErrFailed marks a server that stopped serving on its own: ganesha exited
// or a check kept failing. The share manager then exits non-zero.
var ErrFailed = errors.New("share server failed")

// Run writes the config, starts ganesha, calls ready once the pid file
// exists and the export answers, and watches until ctx ends (then stops
// ganesha, killing it when ctx's cause is ErrLeaseLost, and returns nil) or something fails (then returns an error
// wrapping ErrFailed, with ganesha stopped).
func (s *Server) Run(ctx context.Context, ready func()) error {
	conf, err := s.export().Render()
	if err != nil {
		return err
	}
	if err := os.MkdirAll(s.cfg.Dir, 0o700); err != nil {
		return err
	}
	if err := os.MkdirAll(s.cfg.Export.RecoveryRoot, 0o700); err != nil {
		return fmt.Errorf("recovery root: %w", err)
	}
	if err := atomicfile.Write(s.cfg.ConfigFile(), []byte(conf), 0o600); err != nil {
		return err
	}
	s.killStale()
	if err := os.Remove(s.cfg.PidFile()); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	if err := s.waitPortFree(ctx); err != nil {
		return err
	}
	out, err := os.OpenFile(filepath.Join(s.cfg.Dir, "ganesha.out"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer func() { _ = out.Close() }()
	args := []string{"-F", "-f", s.cfg.ConfigFile(), "-L", s.cfg.LogFile(), "-p", s.cfg.PidFile()}
	// Held while starting: a SetClients meanwhile must not be lost
	// between the file written above and the process it would signal.
	s.mu.Lock()
	now := s.cfg.Export
	now.Clients = s.clients
	if c, err := now.Render(); err == nil && c != conf {
		_ = atomicfile.Write(s.cfg.ConfigFile(), []byte(c), 0o600)
	}
	proc, err := s.exec.Start(s.cfg.Ganesha, args, out)
	if err == nil {
		s.proc = proc
	}
	s.mu.Unlock()
	if err != nil {
		return fmt.Errorf("%w: %w", ErrFailed, err)
	}
	defer func() {
		s.mu.Lock()
		s.proc = nil
		s.mu.Unlock()
	}()
	// exited is closed when ganesha has ended, with waitErr set before.
	exited := make(chan struct{})
	var waitErr error
	go func() { waitErr = proc.Wait(); close(exited) }()
	s.log.Info("ganesha started", "pid", proc.Pid(), "config", s.cfg.ConfigFile(), "endpoint", s.cfg.Export.Endpoint())

	err = s.watch(ctx, exited, func() error { return waitErr }, ready)
	if errors.Is(context.Cause(ctx), ErrLeaseLost) {
		// The Lease is gone: a new server may take over from now on, so
		// this one stops serving at once rather than after a clean
		// shutdown. Nothing acknowledged is lost (stable writes, client
		// records on the volume); clients resend the rest to the next.
		s.log.Info("lease lost: killing ganesha", "pid", proc.Pid())
		_ = proc.Signal(syscall.SIGKILL)
	}
	s.stop(proc, exited)
	return err
}

// watch waits for readiness, then checks periodically.
func (s *Server) watch(ctx context.Context, exited <-chan struct{}, waitErr func() error, ready func()) error {
	start := s.clk.Now()
	tick := s.clk.NewTicker(startPoll)
	defer func() { tick.Stop() }()
	isReady, failures := false, 0
	var lastErr error
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-exited:
			return s.exitedErr(waitErr())
		case <-tick.C():
		}
		if !isReady {
			err := s.readiness(ctx)
			switch {
			case err == nil:
				isReady = true
				s.log.Info("share ready", "after", s.clk.Since(start).String())
				ready()
				tick.Stop()
				tick = s.clk.NewTicker(s.cfg.CheckInterval)
			case ctx.Err() != nil:
				return nil
			case s.clk.Since(start) > s.cfg.StartTimeout:
				return fmt.Errorf("%w: not ready within %s: %w", ErrFailed, s.cfg.StartTimeout, err)
			default:
				s.log.V(1).Info("not ready yet", "reason", err.Error())
			}
			continue
		}
		err := s.health(ctx)
		if ctx.Err() != nil {
			return nil
		}
		if err == nil {
			if failures > 0 {
				s.log.Info("share healthy again", "failedChecks", failures, "lastError", lastErr.Error())
			}
			failures = 0
			continue
		}
		failures++
		lastErr = err
		s.log.Info("share check failed", "failures", failures, "threshold", s.cfg.FailureThreshold, "err", err.Error())
		if failures >= s.cfg.FailureThreshold {
			return fmt.Errorf("%w: %d checks in a row failed, last: %w", ErrFailed, failures, err)
		}
	}
}

// waitPortFree waits, up to StartTimeout, until ganesha's address can be
// bound: a killed ganesha's threads may still hold its socket for a moment
// after it shows as a zombie, and ganesha exits when it cannot bind.
func (s *Server) waitPortFree(ctx context.Context) error {
	addr := net.JoinHostPort(s.cfg.Export.withDefaults().BindAddr, strconv.Itoa(s.cfg.Export.withDefaults().Port))
	start := s.clk.Now()
	for {
		l, err := net.Listen("tcp", addr)
		if err == nil {
			_ = l.Close()
			return nil
		}
		if s.clk.Since(start) > s.cfg.StartTimeout {
			return fmt.Errorf("%w: %s still in use after %s: %w", ErrFailed, addr, s.cfg.StartTimeout, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-s.clk.After(startPoll / 4):
		}
	}
}

// startPoll is how often readiness is tried during the start; ganesha is
// up in well under a second.
const startPoll = 100 * time.Millisecond

func (s *Server) exitedErr(err error) error {
	if err == nil {
		err = errors.New("exit status 0")
	}
	return fmt.Errorf("%w: ganesha exited: %w (log: %s)", ErrFailed, err, s.cfg.LogFile())
}

func (s *Server) readiness(ctx context.Context) error {
	if _, err := os.Stat(s.cfg.PidFile()); err != nil {
		return fmt.Errorf("no pid file yet: %w", err)
	}
	return s.run(ctx, "export", s.checks.Export)
}

func (s *Server) health(ctx context.Context) error {
	if err := s.run(ctx, "device", s.checks.Device); err != nil {
		return err
	}
	return s.run(ctx, "export", s.checks.Export)
}

// run runs one check under CheckTimeout (on the server's clock); a check
// stuck in a system call that ignores ctx is abandoned at the deadline.
func (s *Server) run(ctx context.Context, name string, c Check) error {
	if c == nil {
		return nil
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- c(ctx) }()
	select {
	case err := <-done:
		if err != nil {
			return fmt.Errorf("%s check: %w", name, err)
		}
		return nil
	case <-ctx.Done():
		return fmt.Errorf("%s check: %w", name, ctx.Err())
	case <-s.clk.After(s.cfg.CheckTimeout):
		return fmt.Errorf("%s check: no answer within %s", name, s.cfg.CheckTimeout)
	}
}

// stop sends SIGTERM, then SIGKILL after StopTimeout, and waits.
func (s *Server) stop(proc Process, exited <-chan struct{}) {
	select {
	case <-exited:
		return
	default:
	}
	_ = proc.Signal(syscall.SIGTERM)
	select {
	case <-exited:
		s.log.Info("ganesha stopped", "pid", proc.Pid())
		return
	case <-s.clk.After(s.cfg.StopTimeout):
	}
	s.log.Info("ganesha ignored SIGTERM, killing it", "pid", proc.Pid(), "after", s.cfg.StopTimeout.String())
	_ = proc.Signal(syscall.SIGKILL)
	<-exited
}
