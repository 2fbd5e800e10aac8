//go:build ceph

package ceph

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"

	"github.com/ceph/go-ceph/rbd"
)

// FenceClients puts addrs on Ceph's blocklist for cfg.BlocklistExpire, then
// breaks the exclusive lock on volume id's image that any of them holds
// (an image that does not exist any more is no error). A blocklisted client
// gets an error for every later OSD request (EBLOCKLISTED), never a silent
// success, so another client may take the image over. ctx bounds every
// monitor and OSD request.
func (b *Backend) FenceClients(ctx context.Context, id string, addrs []string) error {
	for _, a := range addrs {
		if err := b.blocklist(ctx, "add", a); err != nil {
			return err
		}
	}
	if err := b.breakLock(ctx, ImageName(id), addrs); err != nil {
		return fmt.Errorf("break the lock of volume %s: %w", id, err)
	}
	b.log.Info("ceph clients fenced", "volume", id, "addresses", addrs, "expire", b.cfg.blocklistExpire())
	return nil
}

// UnfenceClients takes addrs off Ceph's blocklist; an address not on it is
// no error. The client needs the mon cap `allow command "osd blocklist"`:
// `profile rbd` grants adding only.
func (b *Backend) UnfenceClients(ctx context.Context, addrs []string) error {
	for _, a := range addrs {
		if err := b.blocklist(ctx, "rm", a); err != nil {
			return err
		}
	}
	b.log.Info("ceph clients unfenced", "addresses", addrs)
	return nil
}

// Blocklisted lists the addresses (and ranges) on Ceph's blocklist.
func (b *Backend) Blocklisted(ctx context.Context) ([]string, error) {
	var buf []byte
	err := do(ctx, "list the ceph blocklist", func() error {
		return b.monCommand(map[string]any{"prefix": "osd blocklist ls", "format": "json"}, &buf)
	})
	if err != nil {
		return nil, err
	}
	// Pacific answers with two arrays in a row: addresses, then ranges.
	var addrs []string
	dec := json.NewDecoder(bytes.NewReader(buf))
	for dec.More() {
		var entries []struct {
			Addr string `json:"addr"`
		}
		if err := dec.Decode(&entries); err != nil {
			return nil, fmt.Errorf("list the ceph blocklist: %w", err)
		}
		for _, e := range entries {
			addrs = append(addrs, e.Addr)
		}
	}
	return addrs, nil
}

// blocklist runs `osd blocklist add|rm ADDR`.
func (b *Backend) blocklist(ctx context.Context, op, addr string) error {
	cmd := map[string]any{"prefix": "osd blocklist", "blocklistop": op, "addr": addr}
	if op == "add" {
		// A JSON number with a fraction: the monitors take an integer
		// for this float field as a bad field.
		cmd["expire"] = json.Number(strconv.FormatFloat(b.cfg.blocklistExpire().Seconds(), 'f', 1, 64))
	}
	return do(ctx, "", func() error {
		if err := b.monCommand(cmd, nil); err != nil {
			return fmt.Errorf("blocklist %s %s: %w", op, addr, err)
		}
		return nil
	})
}

// breakLock breaks the exclusive lock of image if a client at one of addrs
// holds it.
func (b *Backend) breakLock(ctx context.Context, image string, addrs []string) error {
	return do(ctx, "", func() error {
		img, err := rbd.OpenImage(b.ioctx, image, rbd.NoSnapshot)
		if isNotFound(err) {
			return nil
		} else if err != nil {
			return err
		}
		defer func() { _ = img.Close() }()
		// librbd names an exclusive lock's owner by its client address.
		owners, err := img.LockGetOwners()
		if err != nil {
			return fmt.Errorf("lock owners: %w", err)
		}
		for _, o := range owners {
			if !slices.Contains(addrs, o.Owner) {
				continue
			}
			if err := img.LockBreak(o.Mode, o.Owner); err != nil && !isNotFound(err) {
				return fmt.Errorf("break the lock of %s: %w", o.Owner, err)
			}
		}
		return nil
	})
}

var _ Fencing = (*Backend)(nil)
