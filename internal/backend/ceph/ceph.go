//go:build ceph

package ceph

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"syscall"
	"time"

	"github.com/ceph/go-ceph/rados"
	"github.com/ceph/go-ceph/rbd"
	"github.com/go-logr/logr"

	"github.com/berth-io/berth/internal/backend"
	"github.com/berth-io/berth/internal/volerr"
)

// Backend stores volumes as RBD images. Per-ID serialisation is the
// caller's job, as for backend.Local.
type Backend struct {
	cfg      Config
	features uint64
	conn     *rados.Conn
	ioctx    *rados.IOContext
	log      logr.Logger
}

var (
	_ backend.Store = (*Backend)(nil)
	_ Records       = (*Backend)(nil)
)

// Names in the pool. Image names are derived from the ID so that a failed
// create's leftover is found by name; the omap objects record which IDs
// are complete (the commit point of a create) and their source.
const (
	snapPrefix    = "berth-snap-"
	tmpSnapPrefix = "berth-tmp-"
	volumesOmap   = "berth.volumes"
	snapsOmap     = "berth.snapshots"
	imageAlign    = 4096
)

// ErrHasSnapshots is returned when deleting a volume that has snapshots:
// its RBD snapshots live on its image.
//
// It is a failed precondition (the CSI spec's code for a volume with
// snapshots that cannot be deleted on its own), not an internal error.
var ErrHasSnapshots = volerr.New(volerr.ErrPrecondition, "volume has snapshots")

// New connects as cfg.Client and opens cfg.Pool; ctx bounds the whole of it.
// Unreachable monitors, a refused key and a missing pool each give an error
// that says so.
func New(ctx context.Context, cfg Config, log logr.Logger) (*Backend, error) {
	switch {
	case cfg.Monitors == "":
		return nil, fmt.Errorf("ceph: no monitors: %w", volerr.ErrInvalid)
	case cfg.Pool == "":
		return nil, fmt.Errorf("ceph: no pool: %w", volerr.ErrInvalid)
	case cfg.Client == "" || cfg.Key == "":
		return nil, fmt.Errorf("ceph: client name and key are required: %w", volerr.ErrInvalid)
	}
	if cfg.ConnectTimeout <= 0 {
		cfg.ConnectTimeout = 10 * time.Second
	}
	if cfg.OpTimeout <= 0 {
		cfg.OpTimeout = 30 * time.Second
	}
	names := cfg.Features
	if len(names) == 0 {
		names = []string{rbd.FeatureNameLayering, rbd.FeatureNameExclusiveLock}
		cfg.Features = names
	}
	fs := rbd.FeatureSetFromNames(names)
	features := uint64(fs)
	if len(fs.Names()) != len(names) {
		return nil, fmt.Errorf("ceph: image features %v: unknown name: %w", names, volerr.ErrInvalid)
	}
	b := &Backend{cfg: cfg, features: features, log: log.WithValues("pool", cfg.Pool)}
	done := make(chan error, 1)
	go func() { done <- cfg.enter(b.connect) }()
	select {
	case err := <-done:
		if err != nil {
			return nil, err
		}
	case <-ctx.Done():
		// A connect that succeeds after all must not leak its connection.
		go func() {
			if <-done == nil {
				b.Close()
			}
		}()
		return nil, fmt.Errorf("connect to ceph monitors %s: %w", cfg.Monitors, ctx.Err())
	}
	log.Info("connected to ceph", "config", cfg.String())
	return b, nil
}

// connOptions are the librados options of a connection. No ceph.conf is
// read: everything comes from cfg. The key is passed as an option, never
// written to a file, and no admin socket or log file is made: a socket
// under /var/run/ceph would answer `config show`, key included, to anyone
// who can reach it (F21), as the blockdev servers' connections already
// had it (internal/blockdev/rbdimage).
func connOptions(cfg Config) [][2]string {
	secs := func(d time.Duration) string { return strconv.Itoa(max(1, int(d.Round(time.Second)/time.Second))) }
	return [][2]string{
		{"mon_host", cfg.Monitors},
		{"key", cfg.Key},
		{"auth_client_required", "cephx"},
		{"client_mount_timeout", secs(cfg.ConnectTimeout)},
		{"rados_mon_op_timeout", secs(cfg.OpTimeout)},
		{"rados_osd_op_timeout", secs(cfg.OpTimeout)},
		{"admin_socket", ""},
		{"log_file", ""},
		{"log_to_stderr", "false"},
		{"err_to_stderr", "false"},
	}
}

func (b *Backend) connect() (err error) {
	conn, err := rados.NewConnWithUser(b.cfg.Client)
	if err != nil {
		return fmt.Errorf("ceph client %s: %w", b.cfg.Client, err)
	}
	defer func() {
		if err != nil {
			conn.Shutdown()
		}
	}()
	for _, o := range connOptions(b.cfg) {
		if err := conn.SetConfigOption(o[0], o[1]); err != nil {
			return fmt.Errorf("ceph option %s: %w", o[0], err)
		}
	}
	if err := conn.Connect(); err != nil {
		return fmt.Errorf("connect to ceph monitors %s as client.%s: %w", b.cfg.Monitors, b.cfg.Client, explain(err))
	}
	ioctx, err := conn.OpenIOContext(b.cfg.Pool)
	if err != nil {
		return fmt.Errorf("open pool %s: %w", b.cfg.Pool, poolError(err))
	}
	if b.cfg.DataPool != "" {
		// Only to check it exists: librbd opens it itself.
		dctx, err := conn.OpenIOContext(b.cfg.DataPool)
		if err != nil {
			ioctx.Destroy()
			return fmt.Errorf("open data pool %s: %w", b.cfg.DataPool, poolError(err))
		}
		dctx.Destroy()
	}
	b.conn, b.ioctx = conn, ioctx
	return nil
}

// Close releases the connection. Calls still running (abandoned after their
// ctx ended) must be done; callers close at shutdown only.
func (b *Backend) Close() {
	b.ioctx.Destroy()
	b.conn.Shutdown()
}

// do runs a blocking librados/librbd call and returns when it does or when
// ctx ends, whichever comes first. An abandoned call runs on until
// rados_osd_op_timeout ends it; multi-step calls check ctx between steps
// and undo what they made (see create).
func do(ctx context.Context, op string, fn func() error) error {
	// op "": the caller wraps the error with what it was doing.
	prefix := ""
	if op != "" {
		prefix = op + ": "
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("%s%w", prefix, err)
	}
	done := make(chan error, 1)
	go func() { done <- fn() }()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return fmt.Errorf("%sgave up waiting for ceph: %w", prefix, ctx.Err())
	}
}

// errno is the (positive) errno of a go-ceph error, 0 if it has none.
func errno(err error) syscall.Errno {
	var ce interface{ ErrorCode() int }
	if errors.As(err, &ce) {
		if c := ce.ErrorCode(); c < 0 {
			return syscall.Errno(-c)
		}
		return syscall.Errno(ce.ErrorCode())
	}
	return 0
}

func isNotFound(err error) bool { return errno(err) == syscall.ENOENT }

// explain adds what an errno means for a connection to its error.
func explain(err error) error {
	switch errno(err) {
	case syscall.EACCES, syscall.EPERM:
		return fmt.Errorf("%w: %w", ErrAuthentication, err)
	case syscall.ETIMEDOUT:
		return fmt.Errorf("%w: %w", ErrMonitorsUnreachable, err)
	case syscall.ENOENT:
		return fmt.Errorf("%w: %w", backend.ErrNotFound, err)
	}
	return err
}

// poolError marks a pool that does not exist.
func poolError(err error) error {
	if isNotFound(err) {
		return fmt.Errorf("%w: %w", ErrPoolNotFound, err)
	}
	return explain(err)
}

func alignSize(size int64) (int64, error) {
	if size <= 0 {
		return 0, fmt.Errorf("size %d: %w", size, volerr.ErrInvalid)
	}
	return (size + imageAlign - 1) / imageAlign * imageAlign, nil
}

func (b *Backend) spec(image string) string { return b.cfg.Pool + "/" + image }
