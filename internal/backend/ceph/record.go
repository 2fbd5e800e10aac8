//go:build ceph

package ceph

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"

	"github.com/berth-io/berth/internal/backend"
)

// record is an omap value: what a complete volume or snapshot is made of.
// Writing it is the last step of a create, so an image without one is the
// leftover of a create that did not finish.
type record struct {
	// Image holds the volume (or, for a snapshot, the RBD snapshot Snap).
	Image string `json:"image"`
	Snap  string `json:"snap,omitempty"`
	// Source is "", "snapshot:<id>" or "volume:<id>" for a volume (as
	// backend.Local records it), the source volume's ID for a snapshot.
	Source string `json:"source,omitempty"`
}

// readRecord returns id's record in the omap object oid; ok false if none.
func (b *Backend) readRecord(oid, id string) (rec record, ok bool, err error) {
	// id is the smallest key with prefix id, so it comes first if present.
	vals, err := b.ioctx.GetOmapValues(oid, "", id, 1)
	if isNotFound(err) {
		return record{}, false, nil
	}
	if err != nil {
		return record{}, false, fmt.Errorf("read %s: %w", oid, err)
	}
	v, ok := vals[id]
	if !ok {
		return record{}, false, nil
	}
	if err := json.Unmarshal(v, &rec); err != nil {
		return record{}, false, fmt.Errorf("%s of %s: %w", oid, id, err)
	}
	return rec, true, nil
}

func (b *Backend) writeRecord(oid, id string, rec record) error {
	v, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	if err := b.ioctx.SetOmap(oid, map[string][]byte{id: v}); err != nil {
		return fmt.Errorf("record %s in %s: %w", id, oid, err)
	}
	return nil
}

func (b *Backend) removeRecord(oid, id string) error {
	err := b.ioctx.RmOmapKeys(oid, []string{id})
	if err != nil && !isNotFound(err) {
		return fmt.Errorf("remove %s from %s: %w", id, oid, err)
	}
	return nil
}

// recordIDs lists the IDs in oid, sorted.
func (b *Backend) recordIDs(oid string) ([]string, error) {
	vals, err := b.ioctx.GetAllOmapValues(oid, "", "", 512)
	if isNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list %s: %w", oid, err)
	}
	ids := make([]string, 0, len(vals))
	for k := range vals {
		ids = append(ids, k)
	}
	sort.Strings(ids)
	return ids, nil
}

// getRecord is a Get of a volume or snapshot (what): get reads id's record
// and what it names, under do.
func getRecord[T any](ctx context.Context, what, id string, get func(id string) (T, error)) (T, error) {
	var v T
	if err := backend.ValidateID(id); err != nil {
		return v, err
	}
	err := do(ctx, "get "+what+" "+id, func() error {
		var err error
		v, err = get(id)
		return err
	})
	return v, err
}

// listRecords is a List of the volumes or snapshots (what) recorded in oid,
// in ID order, each read by get; one whose image or snapshot is gone
// (ErrNotFound) is left out.
func listRecords[T any](ctx context.Context, b *Backend, what, oid string, get func(id string) (T, error)) ([]T, error) {
	var out []T
	err := do(ctx, "list "+what, func() error {
		ids, err := b.recordIDs(oid)
		if err != nil {
			return err
		}
		for _, id := range ids {
			v, err := get(id)
			if errors.Is(err, backend.ErrNotFound) {
				continue
			}
			if err != nil {
				return err
			}
			out = append(out, v)
		}
		return nil
	})
	return out, err
}
