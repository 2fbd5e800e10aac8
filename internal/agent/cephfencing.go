package agent

import (
	"context"
	"fmt"

	"github.com/go-logr/logr"

	v1 "github.com/berth-io/berth/api/v1alpha1"
	"github.com/berth-io/berth/internal/backend/ceph"
)

// OpenCephFencing connects to Ceph to blocklist clients (ceph.OpenFencing).
type OpenCephFencing func(ctx context.Context, cfg ceph.Config, log logr.Logger) (ceph.Fencing, error)

// stageFencing is the Blocklister of a stage of a ceph volume: it
// connects with the stage's cephx client only when a lock must be broken
// (most stages break none; none waits on the monitors for it), and close
// ends that connection after Acquire.
type stageFencing struct {
	open func(ctx context.Context) (ceph.Fencing, error)
	f    ceph.Fencing
}

// blocklister returns the Blocklister of a stage of sc's volume with the
// stage's secrets; nil for a volume of another backend.
func (a *Agent) blocklister(sc *v1.StorageCluster, secrets map[string]string) *stageFencing {
	if sc == nil || sc.Spec.Backend != v1.BackendCeph || sc.Spec.Ceph == nil {
		return nil
	}
	open := a.openFencing
	if open == nil {
		open = ceph.OpenFencing
	}
	spec := sc.Spec.Ceph.DeepCopy()
	enter := a.netns.enter("", sc)
	return &stageFencing{open: func(ctx context.Context) (ceph.Fencing, error) {
		cfg, err := ceph.ConfigFor(ctx, spec, secrets[secretUserID], secrets[secretUserKey], nil)
		if err != nil {
			return nil, fmt.Errorf("monitors of StorageCluster %s: %w", sc.Name, err)
		}
		cfg.Enter = enter
		return open(ctx, cfg, a.log.WithName("fencing"))
	}}
}

func (s *stageFencing) get(ctx context.Context) (ceph.Fencing, error) {
	if s.f == nil {
		f, err := s.open(ctx)
		if err != nil {
			return nil, fmt.Errorf("connect to ceph with the stage's client to fence: %w", err)
		}
		s.f = f
	}
	return s.f, nil
}

func (s *stageFencing) FenceClients(ctx context.Context, volume string, addrs []string) error {
	f, err := s.get(ctx)
	if err != nil {
		return err
	}
	return f.FenceClients(ctx, volume, addrs)
}

func (s *stageFencing) UnfenceClients(ctx context.Context, addrs []string) error {
	f, err := s.get(ctx)
	if err != nil {
		return err
	}
	return f.UnfenceClients(ctx, addrs)
}

// close ends the connection, if one was made; a nil s is no fencing.
func (s *stageFencing) close() {
	if s != nil && s.f != nil {
		s.f.Close()
		s.f = nil
	}
}
