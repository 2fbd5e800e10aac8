package heal_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/berth-io/berth/internal/agent"
	"github.com/berth-io/berth/internal/fence"
	"github.com/berth-io/berth/internal/heal"
	"github.com/berth-io/berth/internal/metrics"
	"github.com/berth-io/berth/internal/testenv"
)

type failingHoldings struct{}

func (failingHoldings) ListForNode(context.Context, string) ([]fence.Hold, error) {
	return nil, errors.New("api server down")
}

// TestPassCountsVolumes: a pass counts each volume by what happened to it
// (healed, serving, busy, skipped, failed) and times it; a pass whose
// listing fails counts as a failed pass.
func TestPassCountsVolumes(t *testing.T) {
	reg := prometheus.NewRegistry()
	m, err := metrics.NewHeal(reg)
	if err != nil {
		t.Fatal(err)
	}
	vols := &volumes{calls: map[string]int{}, table: map[string]outcome{
		"a": {res: agent.HealRestarted},
		"b": {res: agent.HealServing},
		"c": {res: agent.HealBusy, err: fmt.Errorf("lock: %w", agent.ErrBusy)},
		"d": {err: fmt.Errorf("list: %w", agent.ErrKeeperDown)},
	}}
	hs := holdings{hold("a", "n1", ""), hold("b", "n1", ""), hold("c", "n1", ""), hold("d", "n1", ""), hold("e", "n1", "")}
	h := &heal.Healer{Node: "n1", Holdings: hs, Volumes: vols, Log: logr.Discard(), Metrics: m}
	if _, err := h.Pass(context.Background()); err != nil {
		t.Fatal(err)
	}
	h.Holdings = failingHoldings{}
	if _, err := h.Pass(context.Background()); err == nil {
		t.Fatal("a pass with a failed listing reported no error")
	}
	got, err := testenv.Gathered(reg)
	if err != nil {
		t.Fatal(err)
	}
	for s, n := range map[string]float64{
		testenv.Series("berth_heal_passes_total", "result", "ok"):                  1,
		testenv.Series("berth_heal_passes_total", "result", "error"):               1,
		testenv.Series("berth_heal_volumes_total", "result", "restarted"):          1,
		testenv.Series("berth_heal_volumes_total", "result", "serving"):            1,
		testenv.Series("berth_heal_volumes_total", "result", "busy"):               1,
		testenv.Series("berth_heal_volumes_total", "result", "failed"):             1,
		testenv.Series("berth_heal_volumes_total", "result", "skipped"):            1,
		testenv.Series("berth_heal_duration_seconds_count", "result", "restarted"): 1,
	} {
		if got[s] != n {
			t.Errorf("%s = %v, want %v", s, got[s], n)
		}
	}
}
