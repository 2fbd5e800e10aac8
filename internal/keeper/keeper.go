package keeper

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"sort"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"golang.org/x/sys/unix"

	"github.com/berth-io/berth/internal/rootsock"
)

// Service holds the connections. Requests are served one at a time: they are
// rare, and serializing them makes every operation trivially atomic.
type Service struct {
	kernel Kernel
	log    logr.Logger

	mu   sync.Mutex
	vols map[string]*held
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
	return &Service{kernel: kernel, log: log, vols: map[string]*held{}}
}

// Listen creates the root-only keeper socket (SOCK_SEQPACKET, so that each
// message and its fd arrive whole).
func Listen(path string) (*net.UnixListener, error) {
	return rootsock.Listen("unixpacket", path)
}

// Serve answers requests on l until ctx ends. The held connections stay
// held when it returns: only process exit (or Close requests) ends them.
func (s *Service) Serve(ctx context.Context, l *net.UnixListener) error {
	go func() {
		<-ctx.Done()
		_ = l.Close()
	}()
	for {
		c, err := l.AcceptUnix()
		if err != nil {
			if ctx.Err() != nil {
				return nil //nolint:nilerr // closing the listener is how Serve stops
			}
			return fmt.Errorf("accept: %w", err)
		}
		go s.serveConn(c)
	}
}

func (s *Service) serveConn(c *net.UnixConn) {
	defer func() { _ = c.Close() }()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
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
		_ = send(c, errorResponse(fmt.Errorf("%w: %w", ErrInvalid, err)), -1)
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	resp, fd := s.handle(req, pid)
	if err := send(c, resp, fd); err != nil {
		s.log.Info("send reply", "op", req.Op, "volume", req.Volume, "err", err)
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
	var oob []byte
	if fd >= 0 {
		oob = unix.UnixRights(fd)
	}
	if _, _, err := c.WriteMsgUnix(b, oob, nil); err != nil {
		return fmt.Errorf("write reply: %w", err)
	}
	return nil
}

// handle runs one request under s.mu; it returns the reply and the fd to
// pass with it (-1 for none).
func (s *Service) handle(req request, pid int32) (response, int) {
	if err := req.validate(); err != nil {
		return errorResponse(err), -1
	}
	log := s.log.WithValues("op", req.Op, "volume", req.Volume)
	switch req.Op {
	case OpPing:
		return response{}, -1
	case OpList:
		return response{Volumes: s.list()}, -1
	case OpOpen:
		h, err := s.open(req.Volume, req.Mountpoint)
		if err == nil {
			err = s.claim(h, pid)
		}
		if err != nil {
			log.Error(err, "open failed")
			return errorResponse(err), -1
		}
		return response{Settings: h.settings}, h.fd
	case OpGet:
		h, ok := s.vols[req.Volume]
		if !ok {
			return errorResponse(fmt.Errorf("%w: %s", ErrNotFound, req.Volume)), -1
		}
		return response{Settings: h.settings}, h.fd
	case OpSaveInit:
		h, ok := s.vols[req.Volume]
		if !ok {
			return errorResponse(fmt.Errorf("%w: %s", ErrNotFound, req.Volume)), -1
		}
		h.settings = req.Settings
		log.Info("saved INIT settings")
		return response{}, -1
	case OpClose:
		if err := s.close(req.Volume); err != nil {
			log.Error(err, "close failed")
			return errorResponse(err), -1
		}
		return response{}, -1
	}
	return errorResponse(fmt.Errorf("%w: op %q", ErrInvalid, req.Op)), -1
}

// open is idempotent: a second open of the same volume and mountpoint returns
// the held connection.
func (s *Service) open(volume, mountpoint string) (*held, error) {
	if h, ok := s.vols[volume]; ok {
		if h.mountpoint != mountpoint {
			return nil, fmt.Errorf("%w: volume %s is mounted at %s, not %s", ErrConflict, volume, h.mountpoint, mountpoint)
		}
		return h, nil
	}
	for name, h := range s.vols {
		if h.mountpoint == mountpoint {
			return nil, fmt.Errorf("%w: mountpoint %s belongs to volume %s", ErrConflict, mountpoint, name)
		}
	}
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
	s.vols[volume] = h
	s.log.Info("opened and mounted", "volume", volume, "mountpoint", mountpoint)
	return h, nil
}

// claim records pid as the volume's server, refusing while another lives.
func (s *Service) claim(h *held, pid int32) error {
	if h.server != nil && h.serverPID != pid && h.server.Alive() {
		return fmt.Errorf("%w: %s by pid %d", ErrServed, h.mountpoint, h.serverPID)
	}
	if h.server != nil && h.serverPID == pid {
		return nil
	}
	p, err := s.kernel.WatchProcess(pid)
	if err != nil {
		return err
	}
	if h.server != nil {
		h.server.Release()
	}
	h.server, h.serverPID = p, pid
	return nil
}

// close is idempotent: an unknown volume is already closed.
func (s *Service) close(volume string) error {
	h, ok := s.vols[volume]
	if !ok {
		return nil
	}
	if err := s.kernel.Unmount(h.mountpoint); err != nil {
		return err
	}
	if err := s.kernel.CloseFD(h.fd); err != nil {
		return fmt.Errorf("close fuse fd: %w", err)
	}
	if h.server != nil {
		h.server.Release()
	}
	delete(s.vols, volume)
	s.log.Info("unmounted and closed", "volume", volume, "mountpoint", h.mountpoint)
	return nil
}

func (s *Service) list() []Volume {
	out := make([]Volume, 0, len(s.vols))
	for name, h := range s.vols {
		v := Volume{Name: name, Mountpoint: h.mountpoint, Initialized: len(h.settings) > 0}
		if h.server != nil && h.server.Alive() {
			v.ServerPID = int(h.serverPID)
		}
		out = append(out, v)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// Held lists the held connections.
func (s *Service) Held() []Volume {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.list()
}
