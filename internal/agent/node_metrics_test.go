package agent

import (
	"context"
	"slices"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1 "github.com/berth-io/berth/api/v1alpha1"
	"github.com/berth-io/berth/internal/keeper"
	"github.com/berth-io/berth/internal/metrics"
)

// TestNodeMetricsCounts: this node's Volumes are counted by state and
// transport (loop for the kernel mounter; for userspace ones the transport
// recorded at stage, else the one new stages get), other nodes' are not;
// the keeper's held connections are its List.
func TestNodeMetricsCounts(t *testing.T) {
	vol := func(name, node string, mounter v1.Mounter, state v1.VolumeState) *v1.Volume {
		return &v1.Volume{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{v1.NodeLabel: node}},
			Spec: v1.VolumeSpec{Node: node, Mounter: mounter}, Status: v1.VolumeStatus{State: state}}
	}
	c := fakeAPI(t,
		vol("k1", "node-a", v1.MounterKernel, v1.VolumeAvailable),
		vol("k2", "node-a", "", v1.VolumeAvailable),
		vol("k3", "node-a", v1.MounterKernel, ""),
		vol("u-nbd", "node-a", v1.MounterUserspace, v1.VolumeAvailable),
		vol("u-new", "node-a", v1.MounterUserspace, v1.VolumeAvailable),
		vol("other", "node-b", v1.MounterKernel, v1.VolumeAvailable),
	).Build()
	k := &hostKeeper{vols: []keeper.Volume{{Name: "u-1"}, {Name: "u-2"}}}
	a := newTestAgent(t, Config{API: c, Userspace: &UserspaceConfig{Root: t.TempDir(), Keeper: k, Transport: TransportFUSE}})
	if err := a.records().save("u-nbd", volumeRecord{Transport: TransportNBD}); err != nil {
		t.Fatal(err)
	}
	n := NodeMetrics{Agent: a, Volumes: c}
	got, err := n.VolumeCounts(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	want := []metrics.VolumeCount{
		{State: "Available", Transport: "fuse", N: 1},
		{State: "Available", Transport: "loop", N: 2},
		{State: "Available", Transport: "nbd", N: 1},
		{State: "Pending", Transport: "loop", N: 1},
	}
	if !slices.Equal(got, want) {
		t.Errorf("VolumeCounts = %+v, want %+v", got, want)
	}
	if conns, err := n.KeeperConnections(context.Background()); err != nil || conns != 2 {
		t.Errorf("KeeperConnections = %d, %v; want 2", conns, err)
	}
	noUserspace := NodeMetrics{Agent: newTestAgent(t, Config{API: c}), Volumes: c}
	if _, err := noUserspace.KeeperConnections(context.Background()); err == nil {
		t.Error("an agent without a keeper reported keeper connections")
	}
}
