//go:build ceph

package ceph

import (
	"context"
	"fmt"
	"syscall"

	"github.com/go-logr/logr"
)

// Open connects as cfg says (New); ctx bounds connecting.
func Open(ctx context.Context, cfg Config, log logr.Logger) (Store, error) {
	b, err := New(ctx, cfg, log)
	if err != nil {
		return nil, err
	}
	return b, nil
}

// OpenRecords connects as cfg says (New), for a caller that only reads and
// writes format records.
func OpenRecords(ctx context.Context, cfg Config, log logr.Logger) (Records, error) {
	b, err := New(ctx, cfg, log)
	if err != nil {
		return nil, err
	}
	return b, nil
}

// OpenFencing connects as cfg says (New), for a caller that only fences.
func OpenFencing(ctx context.Context, cfg Config, log logr.Logger) (Fencing, error) {
	b, err := New(ctx, cfg, log)
	if err != nil {
		return nil, err
	}
	return b, nil
}

// Check connects as cfg says, opens the pool and asks an OSD for one of
// berth's objects, then disconnects: whether volumes could be made, before
// any is. Errors wrap ErrMonitorsUnreachable, ErrAuthentication or
// ErrPoolNotFound where one of them is the cause; ctx and cfg's timeouts
// bound every step.
func Check(ctx context.Context, cfg Config, log logr.Logger) error {
	b, err := New(ctx, cfg, log)
	if err != nil {
		return err
	}
	defer b.Close()
	// Opening a pool needs only the monitors' map; a read proves the
	// client's OSD caps cover the pool. The object need not exist.
	err = do(ctx, "", func() error {
		_, err := b.ioctx.Stat(volumesOmap)
		return err
	})
	if err == nil || errno(err) == syscall.ENOENT {
		return nil
	}
	if errno(err) == syscall.ETIMEDOUT {
		return fmt.Errorf("read from pool %s: no OSD answered: %w", cfg.Pool, err)
	}
	return fmt.Errorf("read from pool %s as client.%s: %w", cfg.Pool, cfg.Client, explain(err))
}
