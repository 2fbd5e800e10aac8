//go:build !ceph

package ceph_test

import (
	"context"
	"errors"
	"testing"

	"github.com/go-logr/logr"

	"github.com/berth-io/berth/internal/backend/ceph"
)

func TestWithoutTheTag(t *testing.T) {
	if err := ceph.Check(context.Background(), ceph.Config{}, logr.Discard()); !errors.Is(err, ceph.ErrNotBuilt) {
		t.Errorf("Check: %v", err)
	}
	if s, err := ceph.Open(context.Background(), ceph.Config{}, logr.Discard()); s != nil || !errors.Is(err, ceph.ErrNotBuilt) {
		t.Errorf("Open: %v, %v", s, err)
	}
	if f, err := ceph.OpenFencing(context.Background(), ceph.Config{}, logr.Discard()); f != nil || !errors.Is(err, ceph.ErrNotBuilt) {
		t.Errorf("OpenFencing: %v, %v", f, err)
	}
}
