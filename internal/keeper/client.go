package keeper

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/berth-io/berth/internal/volerr"
)

// Client talks to a keeper.
type Client struct {
	socket string
}

// Conn is a FUSE connection lent by the keeper: the caller owns File (a dup;
// closing it leaves the keeper's copy open).
type Conn struct {
	File *os.File
	// Settings are the INIT settings a server saved, nil if none yet.
	Settings []byte
}

// Dial returns a client of the keeper at socket after checking it answers.
func Dial(ctx context.Context, socket string) (*Client, error) {
	c := &Client{socket: socket}
	if err := c.Ping(ctx); err != nil {
		return nil, err
	}
	return c, nil
}

// NewClient returns a client without contacting the keeper.
func NewClient(socket string) *Client { return &Client{socket: socket} }

// Ping checks that the keeper answers; ErrUnavailable if not.
func (c *Client) Ping(ctx context.Context) error {
	_, _, err := c.call(ctx, request{Op: OpPing})
	return err
}

// Open opens and mounts the volume's connection at mountpoint, or returns the
// one held (idempotent).
func (c *Client) Open(ctx context.Context, volume, mountpoint string) (*Conn, error) {
	return c.conn(ctx, request{Op: OpOpen, Volume: volume, Mountpoint: mountpoint})
}

// Get returns the held connection of volume (ErrNotFound if none).
func (c *Client) Get(ctx context.Context, volume string) (*Conn, error) {
	return c.conn(ctx, request{Op: OpGet, Volume: volume})
}

// SaveInit stores the INIT settings a server negotiated.
func (c *Client) SaveInit(ctx context.Context, volume string, settings []byte) error {
	if !json.Valid(settings) {
		return fmt.Errorf("%w: settings must be JSON", volerr.ErrInvalid)
	}
	_, _, err := c.call(ctx, request{Op: OpSaveInit, Volume: volume, Settings: settings})
	return err
}

// Close unmounts and closes the volume's connection (idempotent). Detach the
// loop device first: closing aborts whatever still uses the mount.
func (c *Client) Close(ctx context.Context, volume string) error {
	_, _, err := c.call(ctx, request{Op: OpClose, Volume: volume})
	return err
}

// Stop ends the volume's server, if one lives (SIGTERM, then SIGKILL), and
// returns once it is gone. Callers in another PID namespace than the
// keeper's stop servers this way, never by the pid List reports.
func (c *Client) Stop(ctx context.Context, volume string) error {
	_, _, err := c.call(ctx, request{Op: OpStop, Volume: volume})
	return err
}

// List returns the held connections.
func (c *Client) List(ctx context.Context) ([]Volume, error) {
	resp, _, err := c.call(ctx, request{Op: OpList})
	return resp.Volumes, err
}

// Status returns volume's entry of List; found false when the keeper holds
// no connection for it. A keeper older than OpStatus (keepers before
// hand-overs were replaced only when their pod was deleted) is asked with
// List.
func (c *Client) Status(ctx context.Context, volume string) (Volume, bool, error) {
	resp, _, err := c.call(ctx, request{Op: OpStatus, Volume: volume})
	switch {
	case errors.Is(err, ErrNotFound):
		return Volume{}, false, nil
	case errors.Is(err, volerr.ErrInvalid) && strings.Contains(err.Error(), "unknown op"):
		vols, err := c.List(ctx)
		if err != nil {
			return Volume{}, false, err
		}
		for _, v := range vols {
			if v.Name == volume {
				return v, true, nil
			}
		}
		return Volume{}, false, nil
	case err != nil:
		return Volume{}, false, err
	case len(resp.Volumes) != 1 || resp.Volumes[0].Name != volume:
		return Volume{}, false, fmt.Errorf("%w: status of %s answered with %d entries", ErrUnavailable, volume, len(resp.Volumes))
	}
	return resp.Volumes[0], true, nil
}

func (c *Client) conn(ctx context.Context, req request) (*Conn, error) {
	resp, f, err := c.call(ctx, req)
	if err != nil {
		return nil, err
	}
	if f == nil {
		return nil, fmt.Errorf("keeper sent no fd for %s", req.Volume)
	}
	return &Conn{File: f, Settings: resp.Settings}, nil
}

// Serving pings the keeper and returns the pid of the process that
// answered, as this process sees it (0: out of its sight): during a
// hand-over, two keepers share the socket.
func (c *Client) Serving(ctx context.Context) (int32, error) {
	_, _, pid, err := c.exchange(ctx, request{Op: OpPing})
	return pid, err
}

// callTimeout bounds a call, retries included, unless ctx ends sooner.
const callTimeout = 10 * time.Second

// handOverRetry spaces the retries of a request a keeper refused because
// it is handing over (a matter of milliseconds).
const handOverRetry = 20 * time.Millisecond

// call sends one request and reads the reply and a passed fd, if any.
func (c *Client) call(ctx context.Context, req request) (response, *os.File, error) {
	resp, f, _, err := c.exchange(ctx, req)
	return resp, f, err
}

// exchange is call, also returning the pid of the keeper that answered. A
// keeper handing over refuses what would change its table; the request is
// sent again until the keeper that serves answers.
func (c *Client) exchange(ctx context.Context, req request) (response, *os.File, int32, error) {
	ctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	var refused error
	for {
		resp, f, pid, err := c.once(ctx, req)
		if err != nil && refused != nil && ctx.Err() != nil {
			// The time ran out in a retry: why it was needed says more.
			err = refused
		}
		if !errors.Is(err, ErrHandingOver) {
			return resp, f, pid, err
		}
		refused = err
		select {
		case <-ctx.Done():
			return resp, nil, pid, err
		case <-time.After(handOverRetry):
		}
	}
}

func (c *Client) once(ctx context.Context, req request) (response, *os.File, int32, error) {
	var d net.Dialer
	nc, err := d.DialContext(ctx, "unixpacket", c.socket)
	if err != nil {
		return response{}, nil, 0, fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	conn := nc.(*net.UnixConn)
	defer func() { _ = conn.Close() }()
	deadline, _ := ctx.Deadline()
	_ = conn.SetDeadline(deadline)
	if err := passCred(conn); err != nil {
		return response{}, nil, 0, fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	b, err := json.Marshal(req)
	if err != nil {
		return response{}, nil, 0, fmt.Errorf("encode request: %w", err)
	}
	// A keeper at its client limit answers (busy) and closes before it
	// reads: read its answer even when the write failed.
	_, werr := conn.Write(b)
	size := maxMessage
	if req.Op == OpList {
		size = maxListReply
	}
	buf := make([]byte, size)
	oob := make([]byte, unix.CmsgSpace(4)+unix.CmsgSpace(unix.SizeofUcred))
	n, oobn, flags, _, err := conn.ReadMsgUnix(buf, oob)
	if err == nil && n == 0 && werr != nil {
		err = werr
	}
	if err == nil && flags&unix.MSG_TRUNC != 0 {
		err = fmt.Errorf("reply longer than %d bytes", len(buf))
	}
	fds, cred := parseControl(oob[:oobn])
	var pid int32
	if cred != nil {
		pid = cred.Pid
	}
	if err != nil {
		closeFDs(fds)
		if werr != nil {
			return response{}, nil, pid, fmt.Errorf("%w: send request: %w", ErrUnavailable, werr)
		}
		return response{}, nil, pid, fmt.Errorf("%w: read reply: %w", ErrUnavailable, err)
	}
	if len(fds) > 1 {
		closeFDs(fds)
		return response{}, nil, pid, errors.New("keeper passed an unexpected number of fds")
	}
	var f *os.File
	if len(fds) == 1 {
		f = os.NewFile(uintptr(fds[0]), "fuse:"+req.Volume)
	}
	var resp response
	if err := json.Unmarshal(buf[:n], &resp); err != nil {
		closeFile(f)
		return response{}, nil, pid, fmt.Errorf("%w: bad reply: %w", ErrUnavailable, err)
	}
	if err := resp.err(); err != nil {
		closeFile(f)
		return resp, nil, pid, err
	}
	return resp, f, pid, nil
}

func closeFDs(fds []int) {
	for _, fd := range fds {
		_ = unix.Close(fd)
	}
}

func closeFile(f *os.File) {
	if f != nil {
		_ = f.Close()
	}
}
