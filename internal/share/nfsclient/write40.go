package nfsclient

import (
	"context"
	"errors"
	"fmt"
)

// writeStatus40 asks the server why a WRITE of data at off to full made
// no progress. The library reports a failed WRITE as a short write: its
// deferred CLOSE overwrites the WRITE's error. So it sends that WRITE
// again, alone in a compound of its own on a connection of its own, with
// the anonymous stateid (RFC 7530 9.1.4.3: no open and no client ID
// needed) and FILE_SYNC, and returns the server's status: an
// ErrNFSStatus (NFS4ERR_NOSPC unwraps to syscall.ENOSPC), or nil when
// this WRITE went through (space was freed meanwhile).
func (c *Client) writeStatus40(ctx context.Context, full string, off uint64, data []byte) error {
	ctx, cancel := context.WithTimeout(ctx, c.opts.OpTimeout)
	defer cancel()
	conn, err := c.opts.Dial(ctx, "tcp", c.ep.Addr)
	if err != nil {
		return err
	}
	defer conn.Close()
	if deadline, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(deadline)
	}
	defer context.AfterFunc(ctx, func() { _ = conn.Close() })()
	s := &session41{conn: conn, minor: 0, cred: authSys(c.opts.MachineName)}
	var e xdrEnc
	n := lookupOps(&e, full, 0)
	e.u32(opWrite)
	e.fixed(make([]byte, 16)) // the anonymous stateid: all zeros
	e.u64(off)
	e.u32(2) // FILE_SYNC4
	e.opaque(data)
	d, err := s.compound(e.b.Bytes(), n+1)
	if err != nil {
		return err
	}
	skipOps(d, n-1) // compound has read the first result's status
	d.u32()
	d.u32()
	if count := d.u32(); d.err == nil && count == 0 {
		return errors.New("the server wrote nothing and gave no error")
	}
	return d.err
}

// shortWrite is the error of a WriteFile that wrote only written bytes of
// data with no error from the library: the status the server gives a
// second WRITE of the first missing bytes when it fails (not retried
// unless the status passes on its own), else a plain error that is
// retried.
func (c *Client) shortWrite(ctx context.Context, full string, data []byte, written uint64) error {
	short := fmt.Sprintf("wrote %d of %d bytes", written, len(data))
	if written > uint64(len(data)) {
		return errors.New(short)
	}
	chunk := data[written:min(written+writeStatusChunk, uint64(len(data)))]
	err := c.writeStatus40(ctx, full, written, chunk)
	var st ErrNFSStatus
	if errors.As(err, &st) {
		return fmt.Errorf("%s: WRITE at %d: %w", short, written, st)
	}
	if err != nil {
		return fmt.Errorf("%s; asking the server why: %w", short, err)
	}
	return fmt.Errorf("%s, but a second WRITE at %d went through", short, written)
}

// writeStatusChunk bounds the WRITE that writeStatus40 sends again.
const writeStatusChunk = 64 << 10
