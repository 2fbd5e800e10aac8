//go:build !ceph

package ceph

import (
	"context"

	"github.com/go-logr/logr"
)

// Open reports that this binary cannot reach Ceph (see check.go).
func Open(context.Context, Config, logr.Logger) (Store, error) { return nil, ErrNotBuilt }

// OpenFencing reports that this binary cannot reach Ceph (see check.go).
func OpenFencing(context.Context, Config, logr.Logger) (Fencing, error) { return nil, ErrNotBuilt }

// OpenRecords reports that this binary cannot reach Ceph (see check.go).
func OpenRecords(context.Context, Config, logr.Logger) (Records, error) { return nil, ErrNotBuilt }

// Check reports that this binary cannot reach Ceph (see check.go for the
// one built with the ceph tag).
func Check(context.Context, Config, logr.Logger) error { return ErrNotBuilt }
