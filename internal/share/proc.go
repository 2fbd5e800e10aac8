package share

import (
	"fmt"
	"io"
	"os"
	"os/exec"
	"syscall"
)

// Exec starts child processes: OSExec for real, a fake in unit tests.
type Exec interface {
	// Start runs name with args, its stdout and stderr going to out.
	Start(name string, args []string, out io.Writer) (Process, error)
}

// Process is a started child.
type Process interface {
	Pid() int
	Signal(sig os.Signal) error
	// Wait returns when the process has ended; call it once.
	Wait() error
}

// OSExec starts real processes. Each child gets SIGKILL when the share
// manager dies, so a killed share manager never leaves a ganesha behind
// that holds the port and the volume's files.
type OSExec struct{}

// Start implements Exec.
func (OSExec) Start(name string, args []string, out io.Writer) (Process, error) {
	cmd := exec.Command(name, args...)
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	return osProcess{cmd}, nil
}

type osProcess struct{ cmd *exec.Cmd }

func (p osProcess) Pid() int                   { return p.cmd.Process.Pid }
func (p osProcess) Signal(sig os.Signal) error { return p.cmd.Process.Signal(sig) }
func (p osProcess) Wait() error                { return p.cmd.Wait() }
