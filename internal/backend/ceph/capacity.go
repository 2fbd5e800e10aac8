//go:build ceph

package ceph

import (
	"context"
	"encoding/json"
	"fmt"
)

// Capacity returns the bytes the pool can still take: the monitors'
// max_avail (free space over the pool's replication, up to the fullest
// OSD's ratio), less if the pool's byte quota is lower. Images are thin, so
// this is the data that fits, not how many images can be made.
func (b *Backend) Capacity(ctx context.Context) (int64, error) {
	u, err := b.PoolUsage(ctx)
	return u.Free, err
}

// PoolUsage returns the pool's free bytes (as Capacity) and the data it
// stores, from one ceph df.
func (b *Backend) PoolUsage(ctx context.Context) (PoolUsage, error) {
	var u PoolUsage
	err := do(ctx, "capacity of pool "+b.cfg.Pool, func() error {
		var df struct {
			Pools []struct {
				Name  string `json:"name"`
				Stats struct {
					MaxAvail int64 `json:"max_avail"`
					Stored   int64 `json:"stored"`
				} `json:"stats"`
			} `json:"pools"`
		}
		if err := b.monCommand(map[string]any{"prefix": "df", "format": "json"}, &df); err != nil {
			return err
		}
		found := false
		for _, p := range df.Pools {
			if p.Name == b.cfg.Pool {
				u, found = PoolUsage{Free: p.Stats.MaxAvail, Used: p.Stats.Stored}, true
			}
		}
		if !found {
			return fmt.Errorf("pool %s not in ceph df", b.cfg.Pool)
		}
		var quota struct {
			MaxBytes int64 `json:"quota_max_bytes"`
			Used     int64 `json:"current_num_bytes"`
		}
		if err := b.monCommand(map[string]any{"prefix": "osd pool get-quota", "pool": b.cfg.Pool, "format": "json"}, &quota); err != nil {
			return err
		}
		if quota.MaxBytes > 0 {
			u.Free = min(u.Free, max(0, quota.MaxBytes-quota.Used))
		}
		return nil
	})
	return u, err
}

// monCommand sends a mon command and decodes its JSON answer into out
// (nil: no answer expected; a *[]byte gets it undecoded).
func (b *Backend) monCommand(cmd map[string]any, out any) error {
	req, err := json.Marshal(cmd)
	if err != nil {
		return err
	}
	buf, status, err := b.conn.MonCommand(req)
	if err != nil {
		return fmt.Errorf("ceph %s: %w: %s", cmd["prefix"], explain(err), status)
	}
	if raw, ok := out.(*[]byte); ok {
		*raw = buf
		return nil
	}
	if out == nil {
		return nil
	}
	if err := json.Unmarshal(buf, out); err != nil {
		return fmt.Errorf("ceph %s: %w", cmd["prefix"], err)
	}
	return nil
}
