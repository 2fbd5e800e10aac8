package nbd

import (
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// pairs are socketpairs: our end of each (non-blocking, so that Serve's ctx
// can interrupt a read) and the kernel's (blocking, handed over by fd).
type pairs struct {
	our, kern []*os.File
}

func newPairs(n int) (*pairs, error) {
	p := &pairs{}
	for i := range n {
		fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			p.closeOurs()
			p.closeKernel()
			return nil, fmt.Errorf("socketpair: %w", err)
		}
		if err := unix.SetNonblock(fds[0], true); err != nil {
			_ = unix.Close(fds[0])
			_ = unix.Close(fds[1])
			p.closeOurs()
			p.closeKernel()
			return nil, fmt.Errorf("socketpair: %w", err)
		}
		p.our = append(p.our, os.NewFile(uintptr(fds[0]), fmt.Sprintf("nbd-server-%d", i)))
		p.kern = append(p.kern, os.NewFile(uintptr(fds[1]), fmt.Sprintf("nbd-kernel-%d", i)))
	}
	return p, nil
}

func (p *pairs) kernel() []*os.File { return p.kern }
func (p *pairs) ours() []*os.File   { return p.our }

// closeKernel drops our copies of the kernel's ends (the kernel holds its own).
func (p *pairs) closeKernel() {
	for _, f := range p.kern {
		_ = f.Close()
	}
	p.kern = nil
}

func (p *pairs) closeOurs() {
	for _, f := range p.our {
		_ = f.Close()
	}
	p.our = nil
}

// taken closes and drops the pairs whose kernel end is gone (the kernel did
// not keep it) and returns the rest. Call after closeKernel: the last close
// of a socket completes before close(2) returns, so the hang-up is visible.
func (p *pairs) taken() []*os.File {
	var keep []*os.File
	for _, f := range p.our {
		if hungUp(f) {
			_ = f.Close()
			continue
		}
		keep = append(keep, f)
	}
	p.our = nil
	return keep
}

func hungUp(f *os.File) bool {
	rc, err := f.SyscallConn()
	if err != nil {
		return true
	}
	hup := true
	_ = rc.Control(func(fd uintptr) {
		pfd := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLRDHUP}}
		n, err := unix.Poll(pfd, 0)
		hup = err == nil && n > 0 && pfd[0].Revents&(unix.POLLRDHUP|unix.POLLHUP) != 0
	})
	return hup
}
