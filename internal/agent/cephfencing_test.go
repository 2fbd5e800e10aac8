package agent

import (
	"context"
	"testing"

	"github.com/go-logr/logr"

	v1 "github.com/berth-io/berth/api/v1alpha1"
	"github.com/berth-io/berth/internal/backend/ceph"
)

// fakeCephFencing records what a stage's Blocklister asked of Ceph.
type fakeCephFencing struct {
	cfg    ceph.Config
	fenced map[string][]string
	closed bool
}

func (f *fakeCephFencing) FenceClients(_ context.Context, id string, addrs []string) error {
	f.fenced[id] = addrs
	return nil
}
func (f *fakeCephFencing) UnfenceClients(context.Context, []string) error { return nil }
func (f *fakeCephFencing) Close()                                         { f.closed = true }

func TestStageFencingConnectsOnlyToFence(t *testing.T) {
	var opened []*fakeCephFencing
	a := &Agent{log: logr.Discard(), openFencing: func(_ context.Context, cfg ceph.Config, _ logr.Logger) (ceph.Fencing, error) {
		f := &fakeCephFencing{cfg: cfg, fenced: map[string][]string{}}
		opened = append(opened, f)
		return f, nil
	}}
	if bl := a.blocklister(&v1.StorageCluster{}, nil); bl != nil {
		t.Fatal("a local volume got a Ceph blocklister")
	}
	secrets := map[string]string{secretUserID: "berth", secretUserKey: testKey}
	idle := a.blocklister(cephCluster(), secrets)
	idle.close()
	if len(opened) != 0 {
		t.Fatalf("a stage that broke no lock connected to Ceph %d times", len(opened))
	}
	bl := a.blocklister(cephCluster(), secrets)
	for range 2 {
		if err := bl.FenceClients(t.Context(), "vol-a", []string{"10.0.0.1:0/1"}); err != nil {
			t.Fatal(err)
		}
	}
	bl.close()
	if len(opened) != 1 {
		t.Fatalf("connected %d times, want once", len(opened))
	}
	f := opened[0]
	if f.cfg.Client != "berth" || f.cfg.Key != testKey || f.cfg.Pool != "rbd" || f.cfg.Monitors == "" {
		t.Errorf("connected as %+v; want the stage's client on the cluster's monitors and pool", f.cfg)
	}
	if got := f.fenced["vol-a"]; len(got) != 1 || got[0] != "10.0.0.1:0/1" || !f.closed {
		t.Errorf("fenced %v, closed %t", f.fenced, f.closed)
	}
}
