package nfsclient

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/aurorasolar/go-nfs-client/nfs4"
	"github.com/go-logr/logr"
	"k8s.io/utils/clock"
)

// Options tune a Client; zero values take the defaults.
type Options struct {
	// OpTimeout bounds one attempt of one operation (dial included).
	OpTimeout time.Duration
	// RetryInterval is the first pause between attempts; it doubles up
	// to MaxRetryInterval.
	RetryInterval, MaxRetryInterval time.Duration
	// MachineName is sent in AUTH_SYS (default: the host name).
	MachineName string
	// Dial opens the TCP connection (default net.Dialer).
	Dial func(ctx context.Context, network, addr string) (net.Conn, error)
}

func (o Options) withDefaults() Options {
	if o.OpTimeout == 0 {
		o.OpTimeout = 10 * time.Second
	}
	if o.RetryInterval == 0 {
		o.RetryInterval = 50 * time.Millisecond
	}
	if o.MaxRetryInterval == 0 {
		o.MaxRetryInterval = time.Second
	}
	if o.MachineName == "" {
		o.MachineName, _ = os.Hostname()
	}
	if o.Dial == nil {
		var d net.Dialer
		o.Dial = d.DialContext
	}
	return o
}

// Client reaches one export. Every operation retries, reconnecting as
// needed, until it succeeds, fails for good (the file is missing, access is
// denied) or its context ends. Safe for concurrent use; operations run one
// at a time.
type Client struct {
	ep   Endpoint
	opts Options
	clk  clock.Clock
	log  logr.Logger

	mu   sync.Mutex
	conn net.Conn
	nfs  *nfs4.NfsClient
	// connects counts the connections made; read without mu, which an
	// operation holds through all its retries.
	connects atomic.Uint64
}

// Connects is how many connections the client has made so far: a caller
// that saw a server die knows that an answer came from its successor when
// the count has grown since.
func (c *Client) Connects() uint64 { return c.connects.Load() }

// New returns a client of ep; it connects at the first operation.
func New(ep Endpoint, opts Options, clk clock.Clock, log logr.Logger) *Client {
	return &Client{ep: ep, opts: opts.withDefaults(), clk: clk, log: log}
}

// Close drops the connection.
func (c *Client) Close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.drop()
}

func (c *Client) drop() {
	if c.nfs != nil {
		c.nfs.Close()
	} else if c.conn != nil {
		_ = c.conn.Close()
	}
	c.nfs, c.conn = nil, nil
}

// WriteFile writes data as the whole content of name (created or
// truncated). Rewriting the whole file makes a retry after a lost reply
// harmless.
func (c *Client) WriteFile(ctx context.Context, name string, data []byte) error {
	p, err := c.ep.path(name)
	if err != nil {
		return err
	}
	return c.do(ctx, "write "+p, func(n *nfs4.NfsClient) error {
		written, err := n.ReWriteFile(p, bytes.NewReader(data))
		if err == nil && written != uint64(len(data)) {
			// A failed WRITE, its error lost (see writeStatus40): a blind
			// retry would fail the same way until ctx ends.
			return c.shortWrite(ctx, p, data, written)
		}
		return err
	})
}

// ReadFile returns name's whole content.
func (c *Client) ReadFile(ctx context.Context, name string) ([]byte, error) {
	p, err := c.ep.path(name)
	if err != nil {
		return nil, err
	}
	var out []byte
	err = c.do(ctx, "read "+p, func(n *nfs4.NfsClient) error {
		var buf bytes.Buffer
		if _, err := n.ReadFileAll(p, &buf); err != nil {
			return err
		}
		out = buf.Bytes()
		return nil
	})
	return out, err
}

// Remove deletes name; a missing file is not an error.
func (c *Client) Remove(ctx context.Context, name string) error {
	p, err := c.ep.path(name)
	if err != nil {
		return err
	}
	return c.do(ctx, "remove "+p, func(n *nfs4.NfsClient) error {
		if err := n.DeleteFile(p); err != nil && !nfs4.IsNfsError(err, nfs4.ERROR_NOENT) {
			return err
		}
		return nil
	})
}

// Check asks once, without retrying, whether the export answers: a
// connection, a NULL call and a lookup of the export's root. It is the
// share manager's health check.
func (c *Client) Check(ctx context.Context) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.attempt(ctx, func(n *nfs4.NfsClient) error {
		if err := n.Ping(); err != nil {
			return err
		}
		fi, err := n.GetFileInfo(c.ep.Export)
		if err == nil && !fi.IsDir {
			return fmt.Errorf("export %s is not a directory", c.ep.Export)
		}
		return err
	})
}

// do runs op until it succeeds, fails for good or ctx ends.
func (c *Client) do(ctx context.Context, what string, op func(*nfs4.NfsClient) error) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	wait := c.opts.RetryInterval
	for attempt := 1; ; attempt++ {
		err := c.attempt(ctx, op)
		if err == nil {
			if attempt > 1 {
				c.log.V(1).Info("succeeded after retries", "op", what, "attempts", attempt)
			}
			return nil
		}
		if !retryable(err) {
			return fmt.Errorf("%s on %s: %w", what, c.ep, err)
		}
		c.log.V(2).Info("retrying", "op", what, "attempt", attempt, "err", err.Error())
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s on %s: gave up after %d attempts: %w (last error: %w)", what, c.ep, attempt, ctx.Err(), err)
		case <-c.clk.After(wait):
		}
		wait = min(2*wait, c.opts.MaxRetryInterval)
	}
}

// attempt runs op once on the current connection, connecting first when
// there is none; a failed attempt drops the connection unless the server
// answered with a plain NFS error. The library takes no context, so the
// connection's deadline bounds the attempt and closing it ends one that
// ctx cancels.
func (c *Client) attempt(ctx context.Context, op func(*nfs4.NfsClient) error) error {
	ctx, cancel := context.WithTimeout(ctx, c.opts.OpTimeout)
	defer cancel()
	if c.nfs == nil {
		if err := c.connect(ctx); err != nil {
			return err
		}
	}
	deadline, _ := ctx.Deadline()
	_ = c.conn.SetDeadline(deadline)
	stop := context.AfterFunc(ctx, func() { _ = c.conn.SetDeadline(time.Unix(1, 0)) })
	err := safely(func() error { return op(c.nfs) })
	stop()
	if err != nil && (!isNfsError(err) || needsNewClient(err)) {
		c.drop()
	}
	if err != nil && ctx.Err() != nil && !isNfsError(err) {
		return fmt.Errorf("%w: %w", ctx.Err(), err)
	}
	return err
}

func (c *Client) connect(ctx context.Context) error {
	conn, err := c.opts.Dial(ctx, "tcp", c.ep.Addr)
	if err != nil {
		return err
	}
	deadline, _ := ctx.Deadline()
	_ = conn.SetDeadline(deadline)
	// A new client ID each time: the library cannot resume the old state,
	// and the server expires the old client after its lease.
	n, err := safelyNew(func() (*nfs4.NfsClient, error) {
		return nfs4.NewNfsClientWithConn(conn, nfs4.AuthParams{MachineName: c.opts.MachineName})
	})
	if err != nil {
		_ = conn.Close()
		return fmt.Errorf("connect to %s: %w", c.ep.Addr, err)
	}
	c.conn, c.nfs = conn, n
	c.connects.Add(1)
	return nil
}

// safely turns a panic of the library's XDR code on a torn reply into an
// error.
func safely(f func() error) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("nfs client: %v", r)
		}
	}()
	return f()
}

func safelyNew(f func() (*nfs4.NfsClient, error)) (n *nfs4.NfsClient, err error) {
	err = safely(func() error {
		var e error
		n, e = f()
		return e
	})
	return n, err
}

func isNfsError(err error) bool {
	var n *nfs4.NfsError
	return errors.As(err, &n)
}

// NFS errors that a new connection and client ID clear, or that pass on
// their own (grace after a server restart, a busy server).
var (
	transientCodes = map[nfs4.NfsErrorCode]bool{
		nfs4.NfsErrorCode(10013): true, // NFS4ERR_GRACE
		nfs4.NfsErrorCode(10008): true, // NFS4ERR_DELAY
	}
	newClientCodes = map[nfs4.NfsErrorCode]bool{
		nfs4.NfsErrorCode(10022): true, // NFS4ERR_STALE_CLIENTID
		nfs4.NfsErrorCode(10023): true, // NFS4ERR_STALE_STATEID
		nfs4.NfsErrorCode(10011): true, // NFS4ERR_EXPIRED
		nfs4.NfsErrorCode(10025): true, // NFS4ERR_BAD_STATEID
		nfs4.NfsErrorCode(10026): true, // NFS4ERR_BAD_SEQID
		nfs4.NfsErrorCode(10031): true, // NFS4ERR_LEASE_MOVED
		nfs4.NfsErrorCode(70):    true, // NFS4ERR_STALE (a file handle of the old server)
		nfs4.NfsErrorCode(10014): true, // NFS4ERR_FHEXPIRED
	}
)

func needsNewClient(err error) bool {
	var n *nfs4.NfsError
	return errors.As(err, &n) && newClientCodes[n.ErrorCode]
}

// retryable: everything but an NFS error that a retry cannot change.
func retryable(err error) bool {
	var n *nfs4.NfsError
	var st ErrNFSStatus
	switch {
	case errors.As(err, &n):
		return transientCodes[n.ErrorCode] || newClientCodes[n.ErrorCode]
	case errors.As(err, &st):
		code := nfs4.NfsErrorCode(st.Status)
		return transientCodes[code] || newClientCodes[code]
	}
	return true // the connection or the server went away
}
