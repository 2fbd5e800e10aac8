package socket

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"path/filepath"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"

	"github.com/berth-io/berth/internal/agent/errcode"
	"github.com/berth-io/berth/internal/flexvolume"
	"github.com/berth-io/berth/internal/metrics"
	"github.com/berth-io/berth/internal/rootsock"
)

// Ops are the agent operations the socket serves.
type Ops interface {
	Node() string
	FlexMount(ctx context.Context, r flexvolume.MountRequest) error
	FlexUnmount(ctx context.Context, mountDir string) error
}

// Server serves the agent socket.
type Server struct {
	ops Ops
	log logr.Logger
	// ReadTimeout bounds how long a client may take to send its request.
	ReadTimeout time.Duration
	// OpTimeout bounds one operation.
	OpTimeout time.Duration
	// MaxConns bounds the clients served at once (0: DefaultMaxConns).
	MaxConns int
	// Metrics, when set, counts and times every answered request.
	Metrics *metrics.Ops
	// RequireHandshake refuses mount and unmount (CodeNotReady) until a
	// handshake has been answered: the agent that installs the driver runs
	// its init once the socket is up, and serves volumes only after that
	// proved the installed driver reaches it.
	RequireHandshake bool

	handshaken atomic.Bool
}

// DefaultMaxConns bounds the agent socket's clients at once: kubelet runs
// one driver call per volume operation.
const DefaultMaxConns = 64

// NewServer returns a server over ops.
func NewServer(ops Ops, log logr.Logger) *Server {
	return &Server{ops: ops, log: log, ReadTimeout: 5 * time.Second, OpTimeout: 5 * time.Minute}
}

// Listen creates the root-only agent socket at path.
func Listen(path string) (*net.UnixListener, error) {
	return rootsock.Listen("unix", path)
}

// Serve accepts connections until ctx ends. An accept error (out of file
// descriptors) is retried, and at most MaxConns clients are served at once;
// more are answered busy.
func (s *Server) Serve(ctx context.Context, l rootsock.Listener) error {
	loop := &rootsock.Loop{
		MaxConns: s.MaxConns,
		Log:      s.log,
		// Operations under way finish on shutdown (a mount half done helps
		// no one); only new connections stop.
		Handle: func(ctx context.Context, c *net.UnixConn) { s.handle(context.WithoutCancel(ctx), c) },
		Refuse: func(c *net.UnixConn) {
			s.Metrics.Observe(opUnknown, CodeBusy, 0)
			_, _ = bufio.NewReaderSize(io.LimitReader(c, MaxRequestBytes+1), 4096).ReadBytes('\n')
			_ = json.NewEncoder(c).Encode(fail(CodeBusy, fmt.Sprintf("the agent serves %d requests at once already: retry later", s.maxConns())))
		},
	}
	return loop.Serve(ctx, l)
}

func (s *Server) maxConns() int {
	if s.MaxConns > 0 {
		return s.MaxConns
	}
	return DefaultMaxConns
}

func (s *Server) handle(ctx context.Context, c *net.UnixConn) {
	start := time.Now()
	op, resp := s.answer(ctx, c)
	code := resp.Code
	if resp.OK {
		code = metrics.CodeOK
	}
	s.Metrics.Observe(op, code, time.Since(start))
	// A client that stopped reading must not hold a slot.
	_ = c.SetWriteDeadline(time.Now().Add(s.ReadTimeout))
	if err := json.NewEncoder(c).Encode(resp); err != nil {
		s.log.V(1).Info("write response", "error", err.Error())
	}
}

// opUnknown labels requests refused before their op was known (or naming
// an unknown one), so that a client cannot make up label values.
const opUnknown = "unknown"

// answer serves one connection's request and returns its op (for metrics)
// with the response.
func (s *Server) answer(ctx context.Context, c *net.UnixConn) (string, Response) {
	uid, err := peerUID(c)
	if err != nil {
		return opUnknown, fail(CodeDenied, fmt.Sprintf("peer credentials: %v", err))
	}
	if uid != 0 {
		s.log.Info("refused a non-root client", "uid", uid)
		return opUnknown, fail(CodeDenied, fmt.Sprintf("uid %d may not use the agent socket: root only", uid))
	}
	req, err := s.read(c)
	if err != nil {
		return opUnknown, fail(CodeInvalid, err.Error())
	}
	ctx, cancel := context.WithTimeout(ctx, s.OpTimeout)
	defer cancel()
	op := req.Op
	switch op {
	case OpHandshake, OpMount, OpUnmount:
	default:
		op = opUnknown
	}
	return op, s.do(ctx, req)
}

// read reads one request: one JSON object, at most MaxRequestBytes, within
// ReadTimeout. Unknown fields are refused, so a typo never passes silently.
func (s *Server) read(c *net.UnixConn) (*Request, error) {
	if err := c.SetReadDeadline(time.Now().Add(s.ReadTimeout)); err != nil {
		return nil, err
	}
	return readRequest(c)
}

// readRequest is read's parse step: one line holding one JSON object.
func readRequest(r io.Reader) (*Request, error) {
	line, err := bufio.NewReaderSize(io.LimitReader(r, MaxRequestBytes+1), 4096).ReadBytes('\n')
	if len(line) > MaxRequestBytes {
		return nil, fmt.Errorf("request larger than %d bytes", MaxRequestBytes)
	}
	if err != nil && !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("read request: %w", err)
	}
	dec := json.NewDecoder(bytes.NewReader(line))
	dec.DisallowUnknownFields()
	req := &Request{}
	if err := dec.Decode(req); err != nil {
		return nil, fmt.Errorf("malformed request: %w", err)
	}
	if len(bytes.TrimSpace(line[dec.InputOffset():])) > 0 {
		return nil, errors.New("malformed request: data after the JSON object")
	}
	return req, nil
}

func (s *Server) do(ctx context.Context, req *Request) Response {
	log := s.log.WithValues("op", req.Op)
	switch req.Op {
	case OpHandshake:
		s.handshaken.Store(true)
		return Response{OK: true, Version: Version, Node: s.ops.Node()}
	case OpMount, OpUnmount:
		if s.RequireHandshake && !s.handshaken.Load() {
			return fail(CodeNotReady, "agent not ready: the Flexvolume driver's init handshake has not reached it yet "+
				"(the driver is being installed); nothing was changed, retry")
		}
	}
	return s.serveVolume(ctx, log, req)
}

// serveVolume does a mount or unmount request.
func (s *Server) serveVolume(ctx context.Context, log logr.Logger, req *Request) Response {
	var err error
	switch req.Op {
	case OpMount:
		if req.Mount == nil {
			return fail(CodeInvalid, "mount: request has no mount")
		}
		log = log.WithValues("volume", req.Mount.Volume, "mountDir", req.Mount.MountDir)
		err = s.ops.FlexMount(ctx, *req.Mount)
	case OpUnmount:
		if !filepath.IsAbs(req.MountDir) {
			return fail(CodeInvalid, fmt.Sprintf("unmount: mount dir %q is not absolute", req.MountDir))
		}
		log = log.WithValues("mountDir", req.MountDir)
		err = s.ops.FlexUnmount(ctx, req.MountDir)
	default:
		return fail(CodeInvalid, fmt.Sprintf("unknown op %q (known: handshake, mount, unmount)", req.Op))
	}
	if err != nil {
		log.Info("failed", "error", err.Error())
		return fail(codeOf(err), err.Error())
	}
	log.Info("done")
	return Response{OK: true}
}

// codeOf is err's code by the table CSI answers with too.
func codeOf(err error) string { return errcode.Code(err).String() }

func fail(code, msg string) Response { return Response{Code: code, Message: msg} }

func peerUID(c *net.UnixConn) (uint32, error) {
	cred, err := rootsock.PeerCred(c)
	if err != nil {
		return 0, err
	}
	return cred.Uid, nil
}
