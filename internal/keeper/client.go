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
// no connection for it. A keeper older than OpStatus (keepers update only
// when their pod is deleted) is asked with List.
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

// call sends one request and reads the reply and a passed fd, if any.
func (c *Client) call(ctx context.Context, req request) (response, *os.File, error) {
	var d net.Dialer
	nc, err := d.DialContext(ctx, "unixpacket", c.socket)
	if err != nil {
		return response{}, nil, fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	conn := nc.(*net.UnixConn)
	defer func() { _ = conn.Close() }()
	deadline := time.Now().Add(10 * time.Second)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	_ = conn.SetDeadline(deadline)
	b, err := json.Marshal(req)
	if err != nil {
		return response{}, nil, fmt.Errorf("encode request: %w", err)
	}
	// A keeper at its client limit answers (busy) and closes before it
	// reads: read its answer even when the write failed.
	_, werr := conn.Write(b)
	size := maxMessage
	if req.Op == OpList {
		size = maxListReply
	}
	buf := make([]byte, size)
	oob := make([]byte, unix.CmsgSpace(4))
	n, oobn, flags, _, err := conn.ReadMsgUnix(buf, oob)
	if err == nil && n == 0 && werr != nil {
		err = werr
	}
	if err == nil && flags&unix.MSG_TRUNC != 0 {
		err = fmt.Errorf("reply longer than %d bytes", len(buf))
	}
	if err != nil {
		if werr != nil {
			return response{}, nil, fmt.Errorf("%w: send request: %w", ErrUnavailable, werr)
		}
		return response{}, nil, fmt.Errorf("%w: read reply: %w", ErrUnavailable, err)
	}
	f, err := parseRights(oob[:oobn], req.Volume)
	if err != nil {
		return response{}, nil, err
	}
	var resp response
	if err := json.Unmarshal(buf[:n], &resp); err != nil {
		closeFile(f)
		return response{}, nil, fmt.Errorf("%w: bad reply: %w", ErrUnavailable, err)
	}
	if err := resp.err(); err != nil {
		closeFile(f)
		return resp, nil, err
	}
	return resp, f, nil
}

func parseRights(oob []byte, volume string) (*os.File, error) {
	if len(oob) == 0 {
		return nil, nil
	}
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return nil, fmt.Errorf("parse passed fd: %w", err)
	}
	var fds []int
	for _, m := range msgs {
		got, err := unix.ParseUnixRights(&m)
		if err != nil {
			continue
		}
		fds = append(fds, got...)
	}
	if len(fds) != 1 {
		for _, fd := range fds {
			_ = unix.Close(fd)
		}
		return nil, errors.New("keeper passed an unexpected number of fds")
	}
	unix.CloseOnExec(fds[0])
	return os.NewFile(uintptr(fds[0]), "fuse:"+volume), nil
}

func closeFile(f *os.File) {
	if f != nil {
		_ = f.Close()
	}
}
