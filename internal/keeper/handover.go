package keeper

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/berth-io/berth/internal/volerr"
)

// A hand-over runs on the one connection the new keeper opens:
//
//	new -> old  {"op":"hand-over","deadline":D}
//	old -> new  parts: volumes with their FUSE fds and servers' pidfds,
//	            the listening socket's fd in the last part
//	new -> old  {"op":"handed-over","count":N}, once every check passed
//	old -> new  {"done":true}, then it stops accepting and lets go
//
// From the request on, the old keeper refuses what would change its table
// (ErrHandingOver, which clients retry) and waits for what runs. It
// commits only by confirming before D; the new keeper serves only on that
// confirmation, or when the old keeper has exited after the ack. Short of
// that, either side gives up and the old keeper serves on as before.
// Neither side unmounts or closes a connection for a hand-over.

const (
	// handOverTimeout bounds one attempt of a new keeper.
	handOverTimeout = 20 * time.Second
	// maxHandOverTimeout caps the deadline a new keeper may ask for.
	maxHandOverTimeout = time.Minute
	// confirmGrace is how long past D a new keeper waits for the
	// confirmation: the old keeper confirms before D or never.
	confirmGrace = 10 * time.Second
	// startRetry spaces a new keeper's attempts while the old is busy.
	startRetry = 250 * time.Millisecond
)

var (
	// errNoKeeper: nothing listens at the socket.
	errNoKeeper = errors.New("no keeper listens")
	// errCannotHandOver: the keeper listening predates hand-overs.
	errCannotHandOver = errors.New("the keeper listening cannot hand over")
)

// handOver is the old keeper's side, for the process pid on c.
func (s *Service) handOver(c *net.UnixConn, req request, pid int32) {
	deadline := time.Now().Add(maxHandOverTimeout)
	if d := time.Unix(0, req.Deadline); req.Deadline > 0 && d.Before(deadline) {
		deadline = d
	}
	_ = c.SetDeadline(deadline)
	running, err := s.beginHandOver()
	if err != nil {
		_ = send(c, errorResponse(err), -1)
		return
	}
	log := s.log.WithValues("newKeeper", pid)
	log.Info("handing over to a new keeper")
	n, err := s.passHeld(c, running, deadline)
	s.mu.Lock()
	close(s.handing)
	s.handing = nil
	s.mu.Unlock()
	if err != nil {
		log.Error(err, "hand-over failed before the new keeper took over: serving on as before")
		return
	}
	log.Info("handed over to a new keeper", "volumes", n)
}

// beginHandOver marks a hand-over in progress and returns the operations
// running then: none starts from now on.
func (s *Service) beginHandOver() ([]chan struct{}, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.handing != nil {
		return nil, fmt.Errorf("%w: another hand-over is in progress", ErrBusy)
	}
	if s.stopped || s.listener == nil {
		return nil, fmt.Errorf("%w: the keeper is stopping", ErrBusy)
	}
	s.handing = make(chan struct{})
	running := make([]chan struct{}, 0, len(s.busy))
	for _, ended := range s.busy {
		running = append(running, ended)
	}
	return running, nil
}

// passHeld sends what is held and commits on the new keeper's ack; it
// returns the volumes passed.
func (s *Service) passHeld(c *net.UnixConn, running []chan struct{}, deadline time.Time) (int, error) {
	wait := time.NewTimer(min(s.connTimeout(), time.Until(deadline)))
	defer wait.Stop()
	for _, ended := range running {
		select {
		case <-ended:
		case <-wait.C:
			err := fmt.Errorf("%w: an operation in progress did not end", ErrBusy)
			_ = send(c, errorResponse(err), -1)
			return 0, err
		}
	}
	// A dup made here rather than l.File(), which may turn the shared
	// socket to blocking mode under this keeper's accept loop.
	var lfd int
	rc, err := s.listener.SyscallConn()
	if err == nil {
		cerr := rc.Control(func(fd uintptr) { lfd, err = unix.FcntlInt(fd, unix.F_DUPFD_CLOEXEC, 0) })
		err = errors.Join(err, cerr)
	}
	if err != nil {
		err = fmt.Errorf("%w: duplicate the listening socket: %w", ErrBusy, err)
		_ = send(c, errorResponse(err), -1)
		return 0, err
	}
	defer func() { _ = unix.Close(lfd) }()
	vols, fds := s.handed()
	next := 0
	for _, p := range splitParts(vols) {
		var pfds []int
		for range p.Held {
			pfds = append(pfds, fds[next]...)
			next++
		}
		if p.Last {
			pfds = append(pfds, lfd)
		}
		b, err := json.Marshal(p)
		if err != nil {
			return 0, err
		}
		if err := writeMsg(c, b, pfds); err != nil {
			return 0, fmt.Errorf("send %d volumes to the new keeper: %w", len(p.Held), err)
		}
	}
	if err := readAck(c, len(vols)); err != nil {
		return 0, err
	}
	if !time.Now().Before(deadline) {
		return 0, errors.New("the new keeper's ack came after the deadline")
	}
	// Confirmed first: should the new keeper be gone, this one serves on.
	// Until it stops accepting, it refuses what would change its table.
	if err := writeMsg(c, []byte(`{"done":true}`), nil); err != nil {
		return 0, fmt.Errorf("confirm to the new keeper: %w", err)
	}
	s.mu.Lock()
	s.handedOver = len(vols)
	s.mu.Unlock()
	// The path names the new keeper's socket now, the very same one.
	s.listener.SetUnlinkOnClose(false)
	s.stopAccepting()
	s.letGo()
	return len(vols), nil
}

// handed lists what is held, by name, and the fds that go with each.
func (s *Service) handed() ([]handedVolume, [][]int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	names := make([]string, 0, len(s.vols))
	for name := range s.vols {
		names = append(names, name)
	}
	slices.Sort(names)
	vols := make([]handedVolume, 0, len(names))
	fds := make([][]int, 0, len(names))
	for _, name := range names {
		h := s.vols[name]
		v := handedVolume{Name: name, Mountpoint: h.mountpoint, Settings: h.settings}
		f := []int{h.fd}
		if h.server != nil && h.server.FD() >= 0 && h.server.Alive() {
			v.Server, v.ServerPID = true, h.serverPID
			f = append(f, h.server.FD())
		}
		vols = append(vols, v)
		fds = append(fds, f)
	}
	return vols, fds
}

func readAck(c *net.UnixConn, total int) error {
	buf := make([]byte, maxMessage)
	n, _, _, _, err := c.ReadMsgUnix(buf, nil)
	switch {
	case err != nil:
		return fmt.Errorf("wait for the new keeper's ack: %w", err)
	case n == 0:
		return errors.New("the new keeper left before its ack")
	}
	var ack request
	if err := json.Unmarshal(buf[:n], &ack); err != nil || ack.Op != OpHandedOver || ack.Count != total {
		return fmt.Errorf("the new keeper answered %q, not %s of %d volumes", buf[:n], OpHandedOver, total)
	}
	return nil
}

// letGo closes this keeper's copies once the new keeper holds its own: the
// mounts and connections stay.
func (s *Service) letGo() {
	s.mu.Lock()
	vols := s.vols
	s.vols = map[string]*held{}
	s.mu.Unlock()
	for _, h := range vols {
		_ = s.kernel.CloseFD(h.fd)
		if h.server != nil {
			h.server.Release()
		}
	}
}

// Start returns the listener to serve on: that of the keeper answering at
// socket, taken over with every connection it holds, or a new one when
// none answers. A keeper from before hand-overs is waited for: replacing
// its socket would orphan its connections, and they end with it anyway.
func (s *Service) Start(ctx context.Context, socket string) (*net.UnixListener, error) {
	busyUntil := time.Now().Add(handOverTimeout)
	waiting := false
	for {
		l, err := s.takeOver(ctx, socket)
		retry := startRetry
		switch {
		case err == nil:
			return l, nil
		case errors.Is(err, errNoKeeper):
			return Listen(socket)
		case errors.Is(err, errCannotHandOver):
			if !waiting {
				s.log.Info("the keeper at the socket predates hand-overs: waiting for it to exit, which ends its volumes' connections", "socket", socket)
				waiting = true
			}
			retry = time.Second
		case !errors.Is(err, ErrBusy) || time.Now().After(busyUntil):
			return nil, err
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(retry):
		}
	}
}

// takeOver is the new keeper's side of a hand-over from the keeper at
// socket; errNoKeeper when none listens.
func (s *Service) takeOver(ctx context.Context, socket string) (*net.UnixListener, error) {
	deadline := time.Now().Add(handOverTimeout)
	var d net.Dialer
	nc, err := d.DialContext(ctx, "unixpacket", socket)
	if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ECONNREFUSED) {
		return nil, errNoKeeper
	}
	if err != nil {
		return nil, fmt.Errorf("reach the keeper at %s: %w", socket, err)
	}
	c := nc.(*net.UnixConn)
	defer func() { _ = c.Close() }()
	if err := passCred(c); err != nil {
		return nil, err
	}
	_ = c.SetDeadline(deadline.Add(confirmGrace))
	// Giving up is safe until the ack: a stop then ends the attempt.
	unwatch := context.AfterFunc(ctx, func() { _ = c.SetDeadline(time.Now()) })
	defer unwatch()
	b, _ := json.Marshal(request{Op: OpHandOver, Deadline: deadline.UnixNano()})
	if _, err := c.Write(b); err != nil {
		return nil, fmt.Errorf("%w: ask the keeper at %s to hand over: %w", ErrUnavailable, socket, err)
	}
	in := &intake{kernel: s.kernel, vols: map[string]*held{}, mounts: map[string]string{}}
	defer in.discard()
	var old Process
	defer func() {
		if old != nil {
			old.Release()
		}
	}()
	total := -1
	for in.listener == nil {
		p, fds, cred, err := readPart(c)
		switch {
		case errors.Is(err, volerr.ErrInvalid) && strings.Contains(err.Error(), "unknown op"):
			return nil, errCannotHandOver
		case err != nil:
			return nil, fmt.Errorf("take over from the keeper at %s: %w", socket, err)
		case cred == nil || cred.Uid != 0:
			in.closeFDs(fds)
			return nil, fmt.Errorf("the keeper at %s is not root (%+v)", socket, cred)
		case p.Done || (total >= 0 && p.Total != total):
			in.closeFDs(fds)
			return nil, fmt.Errorf("%w: hand-over part out of order", volerr.ErrInvalid)
		}
		if old == nil && cred.Pid > 0 {
			// The old keeper is alive now (it waits): no reuse of its
			// pid can fool the watch.
			if old, err = s.kernel.WatchProcess(cred.Pid); err != nil {
				in.closeFDs(fds)
				return nil, fmt.Errorf("watch the old keeper: %w", err)
			}
		}
		total = p.Total
		vfds := fds
		if p.Last {
			vfds = fds[:len(fds)-1]
		}
		err = in.add(p.Held, vfds)
		if err == nil && p.Last {
			in.listener, err = adoptListener(fds[len(fds)-1], socket)
		} else if p.Last {
			closeFDs(fds[len(fds)-1:])
		}
		if err != nil {
			return nil, fmt.Errorf("take over from the keeper at %s: %w", socket, err)
		}
	}
	if len(in.vols) != total {
		return nil, fmt.Errorf("%w: the keeper at %s handed over %d volumes, announced %d", volerr.ErrInvalid, socket, len(in.vols), total)
	}
	if !unwatch() || !time.Now().Before(deadline) {
		return nil, fmt.Errorf("%w: hand-over from the keeper at %s stopped or out of time", ErrUnavailable, socket)
	}
	b, _ = json.Marshal(request{Op: OpHandedOver, Count: total})
	if _, err := c.Write(b); err != nil {
		return nil, fmt.Errorf("%w: ack to the keeper at %s: %w", ErrUnavailable, socket, err)
	}
	p, fds, _, err := readPart(c)
	in.closeFDs(fds)
	if err == nil && !p.Done {
		err = errors.New("not a confirmation")
	}
	if err != nil {
		// Only a confirmation commits the old keeper: without one it
		// serves on if it lives.
		if old == nil || old.Alive() {
			return nil, fmt.Errorf("the keeper at %s did not confirm the hand-over and serves on: %w", socket, err)
		}
		s.log.Info("the old keeper ended after the ack without confirming: serving its connections", "err", err.Error())
	}
	l := in.listener
	s.mu.Lock()
	for name, h := range in.vols {
		s.vols[name] = h
	}
	s.mu.Unlock()
	in.vols, in.listener = nil, nil
	s.log.Info("took over from the previous keeper", "volumes", total)
	return l, nil
}

// passCred makes the kernel attach the sender's credentials to each
// message c receives (SCM_CREDENTIALS), its pid as this process sees it.
func passCred(c *net.UnixConn) error {
	rc, err := c.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	if err := rc.Control(func(fd uintptr) { serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_PASSCRED, 1) }); err != nil {
		return err
	}
	if serr != nil {
		return fmt.Errorf("SO_PASSCRED: %w", serr)
	}
	return nil
}

// readPart reads one message of the old keeper with its fds and sender.
// On an error it has closed the fds.
func readPart(c *net.UnixConn) (handOverPart, []int, *unix.Ucred, error) {
	buf := make([]byte, maxPart)
	oob := make([]byte, unix.CmsgSpace(4*maxPartFDs)+unix.CmsgSpace(unix.SizeofUcred))
	n, oobn, flags, _, err := c.ReadMsgUnix(buf, oob)
	if err != nil {
		return handOverPart{}, nil, nil, fmt.Errorf("%w: read hand-over: %w", ErrUnavailable, err)
	}
	fds, cred := parseControl(oob[:oobn])
	fail := func(err error) (handOverPart, []int, *unix.Ucred, error) {
		closeFDs(fds)
		return handOverPart{}, nil, cred, err
	}
	switch {
	case n == 0 && oobn == 0:
		return fail(fmt.Errorf("%w: the keeper closed the connection", ErrUnavailable))
	case flags&(unix.MSG_TRUNC|unix.MSG_CTRUNC) != 0:
		return fail(fmt.Errorf("%w: hand-over message cut short", volerr.ErrInvalid))
	}
	p, err := decodePart(buf[:n], len(fds))
	if err != nil {
		return fail(err)
	}
	return p, fds, cred, nil
}

// parseControl returns the fds (close-on-exec) and credentials in oob.
func parseControl(oob []byte) ([]int, *unix.Ucred) {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return nil, nil
	}
	var (
		fds  []int
		cred *unix.Ucred
	)
	for _, m := range msgs {
		switch {
		case m.Header.Level != unix.SOL_SOCKET:
		case m.Header.Type == unix.SCM_RIGHTS:
			got, err := unix.ParseUnixRights(&m)
			if err == nil {
				for _, fd := range got {
					unix.CloseOnExec(fd)
				}
				fds = append(fds, got...)
			}
		case m.Header.Type == unix.SCM_CREDENTIALS:
			if uc, err := unix.ParseUnixCredentials(&m); err == nil {
				cred = uc
			}
		}
	}
	return fds, cred
}

// intake is what a new keeper took so far in a hand-over; it owns their
// fds until they are installed.
type intake struct {
	kernel   Kernel
	vols     map[string]*held
	mounts   map[string]string
	listener *net.UnixListener
}

// add checks vols and takes them with fds, in order. On an error it has
// closed every fd of fds it did not take.
func (in *intake) add(vols []handedVolume, fds []int) error {
	next := 0
	defer func() { in.closeFDs(fds[next:]) }()
	for _, v := range vols {
		fd := fds[next]
		next++
		if err := in.check(v, fd); err != nil {
			_ = in.kernel.CloseFD(fd)
			return err
		}
		h := &held{fd: fd, mountpoint: v.Mountpoint, settings: v.Settings}
		in.vols[v.Name], in.mounts[v.Mountpoint] = h, v.Name
		if !v.Server {
			continue
		}
		pfd := fds[next]
		next++
		proc, pid, err := in.kernel.AdoptProcess(pfd)
		if err != nil {
			_ = in.kernel.CloseFD(pfd)
			return fmt.Errorf("server of %s: %w", v.Name, err)
		}
		h.server, h.serverPID = proc, pid
	}
	return nil
}

func (in *intake) check(v handedVolume, fd int) error {
	if _, dup := in.vols[v.Name]; dup {
		return fmt.Errorf("%w: volume %s handed over twice", volerr.ErrInvalid, v.Name)
	}
	if other, dup := in.mounts[v.Mountpoint]; dup {
		return fmt.Errorf("%w: volumes %s and %s share mountpoint %s", volerr.ErrInvalid, other, v.Name, v.Mountpoint)
	}
	if err := in.kernel.CheckFUSE(fd); err != nil {
		return fmt.Errorf("volume %s: %w", v.Name, err)
	}
	mounted, err := in.kernel.Mounted(v.Mountpoint)
	if err != nil {
		return err
	}
	if !mounted {
		return fmt.Errorf("volume %s: %s is not mounted", v.Name, v.Mountpoint)
	}
	return nil
}

func (in *intake) closeFDs(fds []int) {
	for _, fd := range fds {
		_ = in.kernel.CloseFD(fd)
	}
}

// discard closes what was taken and not installed: the old keeper's
// copies keep every connection alive.
func (in *intake) discard() {
	for _, h := range in.vols {
		_ = in.kernel.CloseFD(h.fd)
		if h.server != nil {
			h.server.Release()
		}
	}
	if in.listener != nil {
		in.listener.SetUnlinkOnClose(false)
		_ = in.listener.Close()
	}
	in.vols, in.listener = nil, nil
}

// adoptListener makes fd, which must listen at socket (SOCK_SEQPACKET),
// this keeper's listener; it closes fd either way.
func adoptListener(fd int, socket string) (*net.UnixListener, error) {
	f := os.NewFile(uintptr(fd), "keeper-listener")
	defer func() { _ = f.Close() }()
	typ, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_TYPE)
	if err != nil || typ != unix.SOCK_SEQPACKET {
		return nil, fmt.Errorf("%w: passed listener is not a SOCK_SEQPACKET socket (type %d, %v)", volerr.ErrInvalid, typ, err)
	}
	if on, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_ACCEPTCONN); err != nil || on != 1 {
		return nil, fmt.Errorf("%w: passed socket does not listen (%v)", volerr.ErrInvalid, err)
	}
	sa, err := unix.Getsockname(fd)
	if ua, ok := sa.(*unix.SockaddrUnix); err != nil || !ok || filepath.Clean(ua.Name) != filepath.Clean(socket) {
		return nil, fmt.Errorf("%w: passed socket is not bound to %s (%v, %v)", volerr.ErrInvalid, socket, sa, err)
	}
	l, err := net.FileListener(f)
	if err != nil {
		return nil, fmt.Errorf("listen on the passed socket: %w", err)
	}
	ul, ok := l.(*net.UnixListener)
	if !ok {
		_ = l.Close()
		return nil, fmt.Errorf("%w: passed socket is a %T", volerr.ErrInvalid, l)
	}
	// As a listener of its own would: the path goes when this keeper
	// exits without handing over.
	ul.SetUnlinkOnClose(true)
	return ul, nil
}
