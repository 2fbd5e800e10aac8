package mount

import (
	"context"
	"fmt"
	"io"
	"strings"
	"sync"

	"k8s.io/utils/exec"
)

// formatGate is the exec that mount-utils' FormatAndMount runs through. It
// decides to format from its own blkid run, which reads a failed probe as
// "blank"; the gate lets mkfs run only on a device that Stage checked
// (allowFormat) a moment before, so that second probe can never format a
// volume that holds data.
type formatGate struct {
	exec.Interface
	mu      sync.Mutex
	allowed map[string]bool
}

func newFormatGate(e exec.Interface) *formatGate {
	return &formatGate{Interface: e, allowed: map[string]bool{}}
}

func (g *formatGate) allow(dev string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.allowed[dev] = true
}

func (g *formatGate) close(dev string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	delete(g.allowed, dev)
}

// permits tells whether a command may run: anything but mkfs, or mkfs whose
// device (mount-utils passes it last) was allowed.
func (g *formatGate) permits(cmd string, args []string) bool {
	if !strings.HasPrefix(cmd, "mkfs") {
		return true
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	return len(args) > 0 && g.allowed[args[len(args)-1]]
}

func (g *formatGate) Command(cmd string, args ...string) exec.Cmd {
	if !g.permits(cmd, args) {
		return refusedCmd{fmt.Errorf("%s %v: device not checked blank: %w", cmd, args, ErrHoldsData)}
	}
	return g.Interface.Command(cmd, args...)
}

func (g *formatGate) CommandContext(ctx context.Context, cmd string, args ...string) exec.Cmd {
	if !g.permits(cmd, args) {
		return refusedCmd{fmt.Errorf("%s %v: device not checked blank: %w", cmd, args, ErrHoldsData)}
	}
	return g.Interface.CommandContext(ctx, cmd, args...)
}

// refusedCmd is a command the gate did not let run: every run fails.
type refusedCmd struct{ err error }

func (c refusedCmd) Run() error                         { return c.err }
func (c refusedCmd) CombinedOutput() ([]byte, error)    { return nil, c.err }
func (c refusedCmd) Output() ([]byte, error)            { return nil, c.err }
func (c refusedCmd) SetDir(string)                      {}
func (c refusedCmd) SetStdin(io.Reader)                 {}
func (c refusedCmd) SetStdout(io.Writer)                {}
func (c refusedCmd) SetStderr(io.Writer)                {}
func (c refusedCmd) SetEnv([]string)                    {}
func (c refusedCmd) StdoutPipe() (io.ReadCloser, error) { return nil, c.err }
func (c refusedCmd) StderrPipe() (io.ReadCloser, error) { return nil, c.err }
func (c refusedCmd) Start() error                       { return c.err }
func (c refusedCmd) Wait() error                        { return c.err }
func (c refusedCmd) Stop()                              {}
