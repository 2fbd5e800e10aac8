package mount

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"k8s.io/utils/exec"
)

// ErrToolTimeout means that an external tool (blkid, mkfs, fsck, resize,
// losetup) ran past its deadline and was killed.
var ErrToolTimeout = errors.New("tool timed out")

// Timeouts bound each external tool the node runs. A tool that blocks (a
// userspace volume whose server died leaves its I/O waiting) must not hold
// the volume lock, and with it the healer that would unblock it, forever.
// Zero fields take the defaults of DefaultTimeouts.
type Timeouts struct {
	// Probe bounds blkid and blockdev (reading a few sectors).
	Probe time.Duration
	// Format bounds mkfs.
	Format time.Duration
	// Check bounds fsck.
	Check time.Duration
	// Resize bounds resize2fs, xfs_growfs and btrfs.
	Resize time.Duration
	// Loop bounds losetup.
	Loop time.Duration
	// Mount bounds mount and umount.
	Mount time.Duration
	// Other bounds any other tool.
	Other time.Duration
	// KillGrace is how long a killed tool may take to exit before the call
	// returns without it: a process in uninterruptible I/O exits only once
	// its I/O ends, and the caller's cleanup (closing the connection) is what
	// ends it.
	KillGrace time.Duration
}

// DefaultTimeouts are the tools' bounds when none are set.
func DefaultTimeouts() Timeouts {
	return Timeouts{
		Probe:     30 * time.Second,
		Format:    10 * time.Minute,
		Check:     10 * time.Minute,
		Resize:    10 * time.Minute,
		Loop:      30 * time.Second,
		Mount:     2 * time.Minute,
		Other:     2 * time.Minute,
		KillGrace: 5 * time.Second,
	}
}

func (t Timeouts) withDefaults() Timeouts {
	d := DefaultTimeouts()
	for _, f := range []struct{ v, def *time.Duration }{
		{&t.Probe, &d.Probe}, {&t.Format, &d.Format}, {&t.Check, &d.Check}, {&t.Resize, &d.Resize},
		{&t.Loop, &d.Loop}, {&t.Mount, &d.Mount}, {&t.Other, &d.Other}, {&t.KillGrace, &d.KillGrace},
	} {
		if *f.v <= 0 {
			*f.v = *f.def
		}
	}
	return t
}

// of returns the bound of the tool named cmd.
func (t Timeouts) of(cmd string) time.Duration {
	switch {
	case cmd == "blkid" || cmd == "blockdev":
		return t.Probe
	case strings.HasPrefix(cmd, "mkfs"):
		return t.Format
	case strings.HasPrefix(cmd, "fsck") || cmd == "e2fsck" || cmd == "xfs_repair":
		return t.Check
	case cmd == "resize2fs" || cmd == "xfs_growfs" || cmd == "btrfs":
		return t.Resize
	case cmd == "losetup":
		return t.Loop
	case cmd == "mount" || cmd == "umount":
		return t.Mount
	}
	return t.Other
}

// Tools runs external tools, each bounded by its timeout and by the context
// it is bound to; it is the exec.Interface mount-utils' format and resize
// helpers get, whose calls take no context.
type Tools struct {
	base     exec.Interface
	timeouts Timeouts
	ctx      context.Context
}

var _ exec.Interface = (*Tools)(nil)

// NewTools returns Tools that run commands through e.
func NewTools(e exec.Interface, t Timeouts) *Tools {
	return &Tools{base: e, timeouts: t.withDefaults(), ctx: context.Background()}
}

// toolsOf returns e as Tools, wrapping a plain executor with the defaults.
func toolsOf(e exec.Interface) *Tools {
	if t, ok := e.(*Tools); ok {
		return t
	}
	return NewTools(e, Timeouts{})
}

// Bind returns Tools whose Command calls end with ctx too.
func (t *Tools) Bind(ctx context.Context) *Tools {
	c := *t
	c.ctx = ctx
	return &c
}

// Command runs cmd bounded by the bound context and cmd's timeout.
func (t *Tools) Command(cmd string, args ...string) exec.Cmd {
	return t.CommandContext(t.ctx, cmd, args...)
}

// CommandContext runs cmd bounded by ctx and cmd's timeout.
func (t *Tools) CommandContext(ctx context.Context, cmd string, args ...string) exec.Cmd {
	timeout := t.timeouts.of(cmd)
	ctx, cancel := context.WithTimeout(ctx, timeout)
	return &boundCmd{Cmd: t.base.CommandContext(ctx, cmd, args...), ctx: ctx, cancel: cancel,
		name: cmd, timeout: timeout, grace: t.timeouts.KillGrace}
}

// LookPath is the base executor's.
func (t *Tools) LookPath(file string) (string, error) { return t.base.LookPath(file) }

// boundCmd is a command whose calls return by its deadline (plus a grace
// for the kill) even when the process cannot exit yet.
type boundCmd struct {
	exec.Cmd
	ctx            context.Context
	cancel         context.CancelFunc
	name           string
	timeout, grace time.Duration
}

func (c *boundCmd) Run() error {
	_, err := c.await(func() ([]byte, error) { return nil, c.Cmd.Run() })
	return err
}

func (c *boundCmd) Wait() error {
	_, err := c.await(func() ([]byte, error) { return nil, c.Cmd.Wait() })
	return err
}

func (c *boundCmd) CombinedOutput() ([]byte, error) { return c.await(c.Cmd.CombinedOutput) }

func (c *boundCmd) Output() ([]byte, error) { return c.await(c.Cmd.Output) }

type result struct {
	out []byte
	err error
}

// await runs f and returns its result, or an ErrToolTimeout once the
// deadline and the grace after the kill have passed. A result that came
// before the deadline is returned as is: callers (mount-utils) read exit
// codes by type assertion.
func (c *boundCmd) await(f func() ([]byte, error)) ([]byte, error) {
	done := make(chan result, 1)
	go func() {
		out, err := f()
		done <- result{out, err}
	}()
	var r result
	select {
	case r = <-done:
	case <-c.ctx.Done():
		grace := time.NewTimer(c.grace)
		defer grace.Stop()
		select {
		case r = <-done:
		case <-grace.C:
			c.cancel()
			// The goroutine reaps the process whenever it exits.
			return nil, fmt.Errorf("%s: %w (%s): it did not exit within %s of being killed (stuck in I/O)",
				c.name, ErrToolTimeout, c.cause(), c.grace)
		}
	}
	expired := c.ctx.Err() != nil
	c.cancel()
	if r.err != nil && expired {
		// Killed: never let a caller read the kill as an exit code (blkid's
		// 2 means "blank").
		return r.out, fmt.Errorf("%s: %w (%s): %v", c.name, ErrToolTimeout, c.cause(), r.err)
	}
	return r.out, r.err
}

func (c *boundCmd) cause() string {
	if errors.Is(c.ctx.Err(), context.DeadlineExceeded) {
		return fmt.Sprintf("deadline: %s or the caller's", c.timeout)
	}
	return "the caller gave up"
}

// gateOver is the format gate (format_gate.go) in front of tools bound to
// one call's context: mkfs runs only where the gate allows, and every tool
// with its timeout.
type gateOver struct {
	gate  *formatGate
	tools *Tools
}

func (g gateOver) Command(cmd string, args ...string) exec.Cmd {
	return g.CommandContext(g.tools.ctx, cmd, args...)
}

func (g gateOver) CommandContext(ctx context.Context, cmd string, args ...string) exec.Cmd {
	if !g.gate.permits(cmd, args) {
		return g.gate.CommandContext(ctx, cmd, args...) // its refusal
	}
	return g.tools.CommandContext(ctx, cmd, args...)
}

func (g gateOver) LookPath(file string) (string, error) { return g.tools.LookPath(file) }
