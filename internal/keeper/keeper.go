package keeper

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"sort"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"golang.org/x/sys/unix"

	"github.com/berth-io/berth/internal/rootsock"
	"github.com/berth-io/berth/internal/volerr"
)

// Service holds the connections. Requests on one volume are served one at
// a time, which makes each operation atomic; requests on different volumes
// run side by side, so a mount that hangs never stalls the other volumes.
type Service struct {
	kernel Kernel
	log    logr.Logger
	// MaxConns bounds the clients served at once (0: 128).
	MaxConns int
	// ConnTimeout bounds one connection: request, operation and reply
	// (0: 10s). An operation on a volume waits that long at most for the
	// one before it.
	ConnTimeout time.Duration

	// mu guards vols, pending and busy, never a syscall that may block.
	mu   sync.Mutex
	vols map[string]*held
	// pending reserves the mountpoints of opens in progress.
	pending map[string]string
	// busy maps a volume with an operation in progress to a channel closed
	// when it ends.
	busy map[string]chan struct{}

	// HandOverWait is how long Serve goes on once ctx ends while it holds
	// connections, for a new keeper to take them over (0: it stops).
	HandOverWait time.Duration
	// listener and stopAccepting are Serve's, for a hand-over to pass on
	// and to end.
	listener      *net.UnixListener
	stopAccepting context.CancelFunc
	// stopped is set once Serve stops accepting without a hand-over.
	stopped bool
	// handing is closed when the hand-over in progress ends (nil: none).
	handing chan struct{}
	// handedOver counts the volumes a hand-over passed; -1 until one did.
	handedOver int
}

type held struct {
	fd         int
	mountpoint string
	settings   json.RawMessage
	// server is the process that last opened the connection to serve it.
	// A second server while it lives would answer requests twice, and a
	// resent write landing after a newer one corrupts data.
	server    Process
	serverPID int32
}

// New returns an empty keeper.
func New(kernel Kernel, log logr.Logger) *Service {
	return &Service{kernel: kernel, log: log, vols: map[string]*held{}, pending: map[string]string{}, busy: map[string]chan struct{}{}, handedOver: -1}
}

// Listen creates the root-only keeper socket (SOCK_SEQPACKET, so that each
// message and its fd arrive whole).
func Listen(path string) (*net.UnixListener, error) {
	return rootsock.Listen("unixpacket", path)
}

// Serve answers requests on l until a new keeper takes over (HandedOver),
// or until ctx ends: at once when nothing is held, else after up to
// HandOverWait of serving on, for a new keeper starting meanwhile (the pod
// replacing this one) to take over. The held connections stay held when it
// returns: only process exit (or Close requests) ends them.
// An accept error (out of file descriptors) is retried: exiting would drop
// every connection of the node.
func (s *Service) Serve(ctx context.Context, l *net.UnixListener) error {
	maxConns := s.MaxConns
	if maxConns <= 0 {
		maxConns = 128
	}
	accept, stop := context.WithCancel(context.Background())
	defer stop()
	s.mu.Lock()
	s.listener, s.stopAccepting = l, stop
	s.mu.Unlock()
	go s.stopAfter(ctx, accept)
	loop := &rootsock.Loop{
		MaxConns: maxConns,
		Log:      s.log,
		Handle:   func(_ context.Context, c *net.UnixConn) { s.serveConn(c) },
		Refuse: func(c *net.UnixConn) {
			_, _, _, _, _ = c.ReadMsgUnix(make([]byte, maxMessage), nil)
			_ = send(c, errorResponse(fmt.Errorf("%w: the keeper serves %d clients at once already", ErrBusy, maxConns)), -1)
		},
	}
	return loop.Serve(accept, l)
}

// stopAfter stops accepting once ctx has ended and no new keeper has taken
// the connections over within HandOverWait; a hand-over in progress then
// ends first. Accepting also stops when a hand-over ends it (accept).
func (s *Service) stopAfter(ctx context.Context, accept context.Context) {
	select {
	case <-accept.Done():
		return
	case <-ctx.Done():
	}
	if n := len(s.Held()); n > 0 && s.HandOverWait > 0 {
		s.log.Info("stopping: serving on until a new keeper takes the connections over", "volumes", n, "wait", s.HandOverWait)
		timer := time.NewTimer(s.HandOverWait)
		defer timer.Stop()
		select {
		case <-accept.Done():
			return
		case <-timer.C:
		}
	}
	s.mu.Lock()
	for s.handing != nil {
		ended := s.handing
		s.mu.Unlock()
		<-ended
		s.mu.Lock()
	}
	if s.handedOver < 0 {
		s.stopped = true
	}
	s.mu.Unlock()
	s.stopAccepting()
}

// HandedOver says whether a new keeper took everything over, and how many
// volumes it took.
func (s *Service) HandedOver() (int, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.handedOver, s.handedOver >= 0
}

func (s *Service) connTimeout() time.Duration {
	if s.ConnTimeout > 0 {
		return s.ConnTimeout
	}
	return 10 * time.Second
}

func (s *Service) serveConn(c *net.UnixConn) {
	ctx, cancel := context.WithTimeout(context.Background(), s.connTimeout())
	defer cancel()
	deadline, _ := ctx.Deadline()
	_ = c.SetDeadline(deadline)
	pid, err := checkRoot(c)
	if err != nil {
		s.log.Info("refused a client", "err", err)
		return
	}
	buf := make([]byte, maxMessage)
	n, _, _, _, err := c.ReadMsgUnix(buf, nil)
	if err != nil {
		s.log.Info("read request", "err", err)
		return
	}
	var req request
	if err := json.Unmarshal(buf[:n], &req); err != nil {
		_ = send(c, errorResponse(fmt.Errorf("%w: %w", volerr.ErrInvalid, err)), -1)
		return
	}
	if err := req.validate(); err != nil {
		_ = send(c, errorResponse(err), -1)
		return
	}
	if _, gone := s.HandedOver(); gone {
		// A client that came in before the listener closed: the new
		// keeper answers its retry.
		_ = send(c, errorResponse(ErrHandingOver), -1)
		return
	}
	if req.Op == OpHandOver {
		s.handOver(c, req, pid)
		return
	}
	if req.Volume != "" {
		// Held until the reply is sent: a close must not free the fd a
		// get is passing.
		release, err := s.lockVolume(ctx, req.Volume, req.Op != OpStatus)
		if errors.Is(err, ErrHandingOver) {
			s.log.Info("refused during the hand-over: the client asks again", "op", req.Op, "volume", req.Volume)
		}
		if err != nil {
			_ = send(c, errorResponse(err), -1)
			return
		}
		defer release()
	}
	resp, fd := s.handle(req, pid)
	if err := send(c, resp, fd); err != nil {
		s.log.Info("send reply", "op", req.Op, "volume", req.Volume, "err", err)
	}
}

// unmark drops key from m (busy or pending) holding mu: the end of an
// operation's mark.
func unmark[V any](mu *sync.Mutex, m map[string]V, key string) {
	mu.Lock()
	defer mu.Unlock()
	delete(m, key)
}

// lockVolume waits until no other operation runs on volume, or ctx ends
// (ErrBusy). An operation that changes what is held (changes) is refused
// while a hand-over runs: it would be lost with this keeper.
func (s *Service) lockVolume(ctx context.Context, volume string, changes bool) (func(), error) {
	for {
		s.mu.Lock()
		if changes && s.handing != nil {
			s.mu.Unlock()
			return nil, ErrHandingOver
		}
		freed, busy := s.busy[volume]
		if !busy {
			done := make(chan struct{})
			s.busy[volume] = done
			s.mu.Unlock()
			return func() {
				unmark(&s.mu, s.busy, volume)
				close(done)
			}, nil
		}
		s.mu.Unlock()
		select {
		case <-freed:
		case <-ctx.Done():
			return nil, fmt.Errorf("%w: another operation on volume %s is still running", ErrBusy, volume)
		}
	}
}

// checkRoot admits only uid 0 (the fd gives full access to the volume) and
// returns the peer's pid.
func checkRoot(c *net.UnixConn) (int32, error) {
	cred, err := rootsock.PeerCred(c)
	if err != nil {
		return 0, err
	}
	if cred.Uid != 0 {
		return 0, fmt.Errorf("peer uid %d (pid %d) is not root", cred.Uid, cred.Pid)
	}
	return cred.Pid, nil
}

func send(c *net.UnixConn, resp response, fd int) error {
	b, err := json.Marshal(resp)
	if err != nil {
		return fmt.Errorf("encode reply: %w", err)
	}
	if len(b) > maxListReply {
		return fmt.Errorf("reply of %d bytes is over %d", len(b), maxListReply)
	}
	var fds []int
	if fd >= 0 {
		fds = []int{fd}
	}
	return writeMsg(c, b, fds)
}

// writeMsg writes b as one message, with fds as SCM_RIGHTS.
func writeMsg(c *net.UnixConn, b []byte, fds []int) error {
	if len(b) > 64<<10 {
		// One SOCK_SEQPACKET message must fit the send buffer (~208 KiB by
		// default): a long List gets room for itself.
		if rc, err := c.SyscallConn(); err == nil {
			_ = rc.Control(func(fd uintptr) {
				_ = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_SNDBUFFORCE, 2*len(b))
			})
		}
	}
	var oob []byte
	if len(fds) > 0 {
		oob = unix.UnixRights(fds...)
	}
	if _, _, err := c.WriteMsgUnix(b, oob, nil); err != nil {
		return fmt.Errorf("write message: %w", err)
	}
	return nil
}

// handle runs one validated request; the caller holds the volume's lock.
// It returns the reply and the fd to pass with it (-1 for none).
func (s *Service) handle(req request, pid int32) (response, int) {
	log := s.log.WithValues("op", req.Op, "volume", req.Volume)
	switch req.Op {
	case OpPing:
		return response{}, -1
	case OpList:
		return response{Volumes: s.Held()}, -1
	case OpStatus:
		v, ok := s.status(req.Volume)
		if !ok {
			return errorResponse(fmt.Errorf("%w: %s", ErrNotFound, req.Volume)), -1
		}
		return response{Volumes: []Volume{v}}, -1
	case OpOpen:
		h, err := s.open(req.Volume, req.Mountpoint)
		if err == nil {
			err = s.claim(h, pid)
		}
		if err != nil {
			log.Error(err, "open failed")
			return errorResponse(err), -1
		}
		return response{Settings: s.settings(h)}, h.fd
	case OpGet:
		h, ok := s.lookup(req.Volume)
		if !ok {
			return errorResponse(fmt.Errorf("%w: %s", ErrNotFound, req.Volume)), -1
		}
		return response{Settings: s.settings(h)}, h.fd
	case OpSaveInit:
		h, ok := s.lookup(req.Volume)
		if !ok {
			return errorResponse(fmt.Errorf("%w: %s", ErrNotFound, req.Volume)), -1
		}
		s.mu.Lock()
		h.settings = req.Settings
		s.mu.Unlock()
		log.Info("saved INIT settings")
		return response{}, -1
	case OpClose:
		if err := s.close(req.Volume); err != nil {
			log.Error(err, "close failed")
			return errorResponse(err), -1
		}
		return response{}, -1
	case OpStop:
		if err := s.stop(req.Volume); err != nil {
			log.Error(err, "stop failed")
			return errorResponse(err), -1
		}
		return response{}, -1
	}
	// A hand-over is served by serveConn, which has the connection.
	return errorResponse(fmt.Errorf("%w: op %q", volerr.ErrInvalid, req.Op)), -1
}

func (s *Service) lookup(volume string) (*held, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	h, ok := s.vols[volume]
	return h, ok
}

func (s *Service) settings(h *held) json.RawMessage {
	s.mu.Lock()
	defer s.mu.Unlock()
	return h.settings
}

// open is idempotent: a second open of the same volume and mountpoint returns
// the held connection. The mount runs outside s.mu, its mountpoint reserved.
func (s *Service) open(volume, mountpoint string) (*held, error) {
	s.mu.Lock()
	if h, ok := s.vols[volume]; ok {
		s.mu.Unlock()
		if h.mountpoint != mountpoint {
			return nil, fmt.Errorf("%w: volume %s is mounted at %s, not %s", ErrConflict, volume, h.mountpoint, mountpoint)
		}
		return h, nil
	}
	for name, h := range s.vols {
		if h.mountpoint == mountpoint {
			s.mu.Unlock()
			return nil, fmt.Errorf("%w: mountpoint %s belongs to volume %s", ErrConflict, mountpoint, name)
		}
	}
	if name, ok := s.pending[mountpoint]; ok {
		s.mu.Unlock()
		return nil, fmt.Errorf("%w: mountpoint %s is being mounted for volume %s", ErrConflict, mountpoint, name)
	}
	s.pending[mountpoint] = volume
	s.mu.Unlock()
	defer unmark(&s.mu, s.pending, mountpoint)
	mounted, err := s.kernel.Mounted(mountpoint)
	if err != nil {
		return nil, err
	}
	if mounted {
		return nil, fmt.Errorf("%w: %s is already mounted but not held by this keeper (left by a dead keeper?)", ErrConflict, mountpoint)
	}
	fd, err := s.kernel.OpenFUSE()
	if err != nil {
		return nil, err
	}
	if err := s.kernel.MountFUSE(fd, "berth:"+volume, mountpoint); err != nil {
		_ = s.kernel.CloseFD(fd)
		return nil, err
	}
	h := &held{fd: fd, mountpoint: mountpoint}
	s.mu.Lock()
	s.vols[volume] = h
	s.mu.Unlock()
	s.log.Info("opened and mounted", "volume", volume, "mountpoint", mountpoint)
	return h, nil
}

// claim records pid as the volume's server, refusing while another lives.
func (s *Service) claim(h *held, pid int32) error {
	s.mu.Lock()
	server, serverPID := h.server, h.serverPID
	s.mu.Unlock()
	if server != nil && serverPID != pid && server.Alive() {
		return fmt.Errorf("%w: %s by pid %d", ErrServed, h.mountpoint, serverPID)
	}
	if server != nil && serverPID == pid {
		return nil
	}
	p, err := s.kernel.WatchProcess(pid)
	if err != nil {
		return err
	}
	s.mu.Lock()
	h.server, h.serverPID = p, pid
	s.mu.Unlock()
	if server != nil {
		server.Release()
	}
	return nil
}

// stopWait bounds each of the two waits of a stop (after SIGTERM, after
// SIGKILL): together well within a connection's time.
const stopWait = 3 * time.Second

// stop ends the volume's server through the keeper's own handle on it (a
// pidfd): the pid the keeper reports is of its PID namespace, which need
// not be the caller's. No server (or none alive) is success.
func (s *Service) stop(volume string) error {
	h, ok := s.lookup(volume)
	if !ok {
		return nil
	}
	s.mu.Lock()
	server := h.server
	s.mu.Unlock()
	if server == nil || !server.Alive() {
		return nil
	}
	if err := server.Stop(stopWait); err != nil {
		return fmt.Errorf("stop server of %s: %w", volume, err)
	}
	s.log.Info("stopped server", "volume", volume)
	return nil
}

// close is idempotent: an unknown volume is already closed.
func (s *Service) close(volume string) error {
	h, ok := s.lookup(volume)
	if !ok {
		return nil
	}
	if err := s.kernel.Unmount(h.mountpoint); err != nil {
		return err
	}
	if err := s.kernel.CloseFD(h.fd); err != nil {
		return fmt.Errorf("close fuse fd: %w", err)
	}
	s.mu.Lock()
	delete(s.vols, volume)
	server := h.server
	s.mu.Unlock()
	if server != nil {
		server.Release()
	}
	s.log.Info("unmounted and closed", "volume", volume, "mountpoint", h.mountpoint)
	return nil
}

// list needs s.mu.
func (s *Service) list() []Volume {
	out := make([]Volume, 0, len(s.vols))
	for name, h := range s.vols {
		out = append(out, h.entry(name))
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// status is volume's entry of list.
func (s *Service) status(volume string) (Volume, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	h, ok := s.vols[volume]
	if !ok {
		return Volume{}, false
	}
	return h.entry(volume), true
}

// entry is h's line of List, held under mu.
func (h *held) entry(name string) Volume {
	v := Volume{Name: name, Mountpoint: h.mountpoint, Initialized: len(h.settings) > 0}
	if h.server != nil && h.server.Alive() {
		v.ServerPID = int(h.serverPID)
	}
	return v
}

// Held lists the held connections.
func (s *Service) Held() []Volume {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.list()
}
