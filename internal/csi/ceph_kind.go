//go:build ceph

package csi

import (
	"errors"

	"github.com/berth-io/berth/internal/backend/ceph"
)

// cephHasSnapshots: a volume whose image still has snapshots, which Ceph
// cannot delete on its own.
func cephHasSnapshots(err error) bool { return errors.Is(err, ceph.ErrHasSnapshots) }
