package socket

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/berth-io/berth/internal/agent"
	"github.com/berth-io/berth/internal/flexvolume"
	"github.com/berth-io/berth/internal/metrics"
	"github.com/berth-io/berth/internal/testenv"
)

// answeringOps: a mount of volume "taken" is refused as busy, any other
// mount succeeds; an unmount of an unknown dir is not found.
type answeringOps struct{}

func (answeringOps) Node() string { return "n1" }
func (answeringOps) FlexMount(_ context.Context, r flexvolume.MountRequest) error {
	if r.Volume == "taken" {
		return fmt.Errorf("volume taken: %w", agent.ErrBusy)
	}
	return nil
}
func (answeringOps) FlexUnmount(_ context.Context, dir string) error {
	return fmt.Errorf("nothing at %s: %w", dir, agent.ErrVolumeNotFound)
}

// TestSocketCountsRequests: every answered request is counted under its op
// (unknown ones under "unknown", so a client cannot invent label values)
// and its answer code, and timed.
func TestSocketCountsRequests(t *testing.T) {
	reg := prometheus.NewRegistry()
	m, err := metrics.NewOps(reg, metrics.BoundaryFlexvolume)
	if err != nil {
		t.Fatal(err)
	}
	s := NewServer(answeringOps{}, logr.Discard())
	s.Metrics = m
	path := start(t, s)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, req := range []Request{
		{Op: OpHandshake},
		{Op: OpMount, Mount: &flexvolume.MountRequest{Volume: "free"}},
		{Op: OpMount, Mount: &flexvolume.MountRequest{Volume: "taken"}},
		{Op: OpMount},
		{Op: OpUnmount, MountDir: "/nowhere"},
		{Op: "made-up-op"},
	} {
		if _, err := Call(ctx, path, req); err != nil {
			t.Fatalf("%+v: %v", req, err)
		}
	}
	got, err := testenv.Gathered(reg)
	if err != nil {
		t.Fatal(err)
	}
	series := func(op, code string) string {
		return testenv.Series("berth_flexvolume_requests_total", "operation", op, "code", code)
	}
	for s, n := range map[string]float64{
		series("handshake", "OK"):      1,
		series("mount", "OK"):          1,
		series("mount", CodeBusy):      1,
		series("mount", CodeInvalid):   1,
		series("unmount", "NotFound"):  1,
		series("unknown", CodeInvalid): 1,
		testenv.Series("berth_flexvolume_request_duration_seconds_count", "operation", "mount"): 3,
	} {
		if got[s] != n {
			t.Errorf("%s = %v, want %v", s, got[s], n)
		}
	}
	if _, ok := got[series("made-up-op", CodeInvalid)]; ok {
		t.Error("an unknown op became a label value")
	}
}
