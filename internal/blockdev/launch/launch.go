// Package launch starts and stops `berth blockdev` server processes: the
// agent's side of a userspace volume's server.
package launch

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/berth-io/berth/internal/network"
)

// Params starts a server process.
type Params struct {
	// Binary is the berth binary; the process runs `Binary blockdev ...`.
	Binary       string
	KeeperSocket string
	// Node (nbd, ublk) is the agent's node, part of the device's
	// identifier (nbd) or tag (ublk).
	Node       string
	Volume     string
	Image      string
	Mountpoint string
	Workers    int // 0: the server's default
	// NoDirect turns O_DIRECT on the image off.
	NoDirect bool
	// Passthrough lets the kernel do data I/O on the image itself (6.9+);
	// the server then answers only metadata, fsync and fallocate.
	Passthrough bool
	// Transport is "fuse" (the default when empty: FUSE file + loop, through
	// the keeper), "nbd" (the kernel's nbd driver) or "ublk" (the kernel's
	// ublk driver). KeeperSocket and Mountpoint are for fuse only.
	Transport string
	// UblkRecover (ublk), when set, is the ublk device whose server died:
	// the kernel kept it, and the new server takes it over (user
	// recovery). Nil: the server adds a new device.
	UblkRecover *uint32
	// DeadConnTimeout (nbd) is how long the kernel queues I/O while no server
	// is connected; 0: the server's default.
	DeadConnTimeout time.Duration
	// Connections (nbd) is the number of sockets of a new device; 0: default.
	Connections int
	// IOErrorsFile, when set, is where the server counts the requests its
	// image failed (blockdev.IOErrors).
	IOErrorsFile string
	// Stderr receives the server's log (nil: discarded).
	Stderr io.Writer
	// NetNS is a network namespace to start the server in (nil: this
	// process's): the netns mode, where a holder's namespace carries the
	// storage network. The whole process starts there, so every socket its
	// libraries open from their own threads (librados) is in it.
	NetNS *os.File
	// Hold (fuse), when set, holds the server's I/O after its takeover
	// until the group releases (HoldGroup); the server's hold pipe is fd 4.
	Hold *HoldGroup
}

// SlimBinaryName is the file name, beside the berth binary, of
// cmd/berth-blockdev: `berth blockdev` alone, static, without the ceph
// backend, and so several times cheaper to start (see its package comment).
const SlimBinaryName = "berth-blockdev"

// CephBinaryName is the file name, beside the berth binary, of
// cmd/berth-blockdev built with the ceph backend (cgo, librbd): the server
// of rbd images without the Kubernetes packages of the multi-call binary,
// whose init cost each server start CPU and its heap memory for good.
const CephBinaryName = "berth-blockdev-ceph"

// SlimBinary is the slim server binary beside berth (SlimBinaryName), or
// "" when there is none; it serves file images, not rbd ones.
func SlimBinary(berth string) string { return beside(berth, SlimBinaryName) }

// CephBinary is the server binary for rbd images beside berth
// (CephBinaryName), or "" when there is none (a build without the ceph
// backend, or an older image).
func CephBinary(berth string) string { return beside(berth, CephBinaryName) }

// beside is the executable file name in berth's folder, or "".
func beside(berth, name string) string {
	p := filepath.Join(filepath.Dir(berth), name)
	if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0 {
		return p
	}
	return ""
}

// Transports of Params.Transport: the values of the API's
// UserspaceTransport (TestTransportsMatchTheAPI), spelled out here so that
// the server binary, which imports this package, links no Kubernetes API
// package (their init costs every server start).
const (
	TransportFUSE = "fuse"
	TransportNBD  = "nbd"
	TransportUblk = "ublk"
)

// args is the server's command line (its ready pipe is fd 3, its hold pipe
// fd 4).
func (p Params) args() ([]string, error) {
	if p.Binary == "" || p.Volume == "" || p.Image == "" {
		return nil, errors.New("blockdev: Start needs binary, volume and image")
	}
	common := []string{"--volume", p.Volume, "--image", p.Image,
		"--ready-fd", "3", "--workers", strconv.Itoa(p.Workers),
		"--direct=" + strconv.FormatBool(!p.NoDirect)}
	if p.IOErrorsFile != "" {
		common = append(common, "--io-errors-file", p.IOErrorsFile)
	}
	switch p.Transport {
	case "", TransportFUSE:
		if p.KeeperSocket == "" || p.Mountpoint == "" {
			return nil, errors.New("blockdev: the fuse transport needs a keeper socket and a mountpoint")
		}
		args := append(append([]string{"blockdev"}, common...),
			"--keeper-socket", p.KeeperSocket, "--mountpoint", p.Mountpoint,
			"--passthrough="+strconv.FormatBool(p.Passthrough))
		if p.Hold != nil {
			args = append(args, "--hold-fd", "4")
		}
		return args, nil
	case TransportNBD:
		args := append([]string{"blockdev", "--transport", TransportNBD}, common...)
		if p.DeadConnTimeout > 0 {
			args = append(args, "--dead-conn-timeout", p.DeadConnTimeout.String())
		}
		if p.Connections > 0 {
			args = append(args, "--connections", strconv.Itoa(p.Connections))
		}
		if p.Node != "" {
			args = append(args, "--node", p.Node)
		}
		return args, nil
	case TransportUblk:
		args := append([]string{"blockdev", "--transport", TransportUblk}, common...)
		if p.Node != "" {
			args = append(args, "--node", p.Node)
		}
		if p.UblkRecover != nil {
			args = append(args, "--ublk-recover", strconv.FormatUint(uint64(*p.UblkRecover), 10))
		}
		return args, nil
	}
	return nil, fmt.Errorf("blockdev: unknown transport %q (want %s, %s or %s)", p.Transport, TransportFUSE, TransportNBD, TransportUblk)
}

// errorPrefix starts the line a server writes instead of "ready" when it
// fails before it serves.
const errorPrefix = "error "

// ErrorLine is the line a server that failed before it was ready writes
// on its ready fd: the reason on one line.
func ErrorLine(err error) string {
	return errorPrefix + strings.Join(strings.Fields(err.Error()), " ")
}

// errServer is a server's own reason for failing to start.
type errServer struct{ msg string }

func (e errServer) Error() string { return e.msg }

// parseReady reads the server's ready line: "ready" (fuse) or
// "ready <device>" (nbd, ublk), or the server's reason for failing.
func parseReady(line string) (device string, err error) {
	if msg, ok := strings.CutPrefix(line, errorPrefix); ok {
		return "", errServer{msg: strings.TrimSpace(msg)}
	}
	rest, ok := strings.CutPrefix(line, "ready")
	if !ok || !strings.HasSuffix(rest, "\n") {
		return "", fmt.Errorf("unexpected message %q", line)
	}
	rest = strings.TrimSuffix(rest, "\n")
	if rest == "" {
		return "", nil
	}
	if rest[0] != ' ' || strings.TrimSpace(rest) == "" {
		return "", fmt.Errorf("unexpected message %q", line)
	}
	return strings.TrimSpace(rest), nil
}

// Process is a running server.
type Process struct {
	cmd    *exec.Cmd
	device string // nbd, ublk: the device it serves
	done   chan struct{}
	err    error
}

// readyTimeout bounds how long Start waits for the server to answer.
const readyTimeout = 30 * time.Second

// Start runs a server process and returns once it answers requests (or
// fails). The process is not tied to ctx: it outlives the call.
func Start(ctx context.Context, p Params) (*Process, error) {
	args, err := p.args()
	if err != nil {
		return nil, err
	}
	r, w, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("ready pipe: %w", err)
	}
	defer func() { _ = r.Close() }()
	cmd := exec.Command(p.Binary, args...)
	cmd.Stdout = p.Stderr
	cmd.Stderr = p.Stderr
	cmd.ExtraFiles = []*os.File{w}
	var hold *os.File
	if p.Hold != nil && (p.Transport == "" || p.Transport == TransportFUSE) {
		hr, hw, err := os.Pipe()
		if err != nil {
			_ = w.Close()
			return nil, fmt.Errorf("hold pipe: %w", err)
		}
		defer func() { _ = hr.Close() }()
		cmd.ExtraFiles, hold = append(cmd.ExtraFiles, hr), hw
	}
	// Its own process group: a terminal's or parent's group signal must not
	// reach it; the owner stops it by PID.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if p.NetNS != nil {
		// The child is cloned from the thread that starts it, in the
		// namespace that thread is in.
		err = network.NewInNamespace(network.ThreadSwitcher{}).Do(netns.NsHandle(p.NetNS.Fd()), cmd.Start)
	} else {
		err = cmd.Start()
	}
	_ = w.Close()
	if err != nil {
		if hold != nil {
			_ = hold.Close()
		}
		return nil, fmt.Errorf("start %s blockdev: %w", p.Binary, err)
	}
	if hold != nil {
		p.Hold.hold(hold)
	}
	proc := &Process{cmd: cmd, done: make(chan struct{})}
	go func() {
		proc.err = cmd.Wait()
		close(proc.done)
	}()
	ready := make(chan error, 1)
	go func() {
		line, err := bufio.NewReader(r).ReadString('\n')
		if err == nil {
			proc.device, err = parseReady(line)
			if err == nil {
				ready <- nil
				return
			}
			var own errServer
			if errors.As(err, &own) {
				ready <- fmt.Errorf("server failed: %w", err)
				return
			}
		}
		ready <- fmt.Errorf("server exited before it was ready (%q): %w", line, err)
	}()
	timer := time.NewTimer(readyTimeout)
	defer timer.Stop()
	select {
	case err = <-ready:
	case <-ctx.Done():
		err = ctx.Err()
	case <-timer.C:
		err = errors.New("server not ready in time")
	}
	if err != nil {
		_ = proc.Kill()
		<-proc.done
		return nil, fmt.Errorf("blockdev server for %s: %w (exit: %w)", p.Volume, err, proc.err)
	}
	return proc, nil
}

// Device is the nbd or ublk device the server serves ("" for the fuse
// transport).
func (p *Process) Device() string { return p.device }

// PID is the server's process id.
func (p *Process) PID() int { return p.cmd.Process.Pid }

// Done is closed when the process has exited.
func (p *Process) Done() <-chan struct{} { return p.done }

// Kill sends SIGKILL (what a crash looks like; the next server resends).
func (p *Process) Kill() error {
	err := p.cmd.Process.Signal(syscall.SIGKILL)
	if errors.Is(err, os.ErrProcessDone) {
		return nil
	}
	return err
}

// Stop asks the server to finish the requests in hand and exit (SIGTERM),
// then kills it after timeout. It returns once the process is gone. The
// signals go through the child's pidfd (os.Process holds one on Linux), so
// they never reach another process that reused the pid.
func (p *Process) Stop(timeout time.Duration) error {
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("stop blockdev server %d: %w", p.PID(), err)
	}
	select {
	case <-p.done:
		return nil
	case <-time.After(timeout):
	}
	if err := p.Kill(); err != nil {
		return fmt.Errorf("kill blockdev server %d: %w", p.PID(), err)
	}
	<-p.done
	return nil
}

// StopPID stops a server this process did not start (an agent restarted and
// found it in its own /proc): SIGTERM, then SIGKILL after timeout. pid must
// be of this process's PID namespace. It follows the process through a
// pidfd, and runs still (nil: none) once the pidfd is open: a pid that was
// reused before then fails the check and is left alone.
func StopPID(pid int, timeout time.Duration, still func() bool) error {
	fd, err := unix.PidfdOpen(pid, 0)
	if errors.Is(err, unix.ESRCH) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("open pidfd of %d: %w", pid, err)
	}
	defer func() { _ = unix.Close(fd) }()
	if still != nil && !still() {
		return nil
	}
	exited := func(wait time.Duration) bool {
		fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		n, err := unix.Poll(fds, int(wait.Milliseconds()))
		return err == nil && n > 0
	}
	for _, sig := range []unix.Signal{unix.SIGTERM, unix.SIGKILL} {
		if err := unix.PidfdSendSignal(fd, sig, nil, 0); err != nil && !errors.Is(err, unix.ESRCH) {
			return fmt.Errorf("signal %d: %w", pid, err)
		}
		if exited(timeout) {
			return nil
		}
	}
	return fmt.Errorf("blockdev server %d did not exit after SIGKILL", pid)
}
