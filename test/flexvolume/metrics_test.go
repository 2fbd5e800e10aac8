package flexvolume

import (
	"testing"

	v1 "github.com/berth-io/berth/api/v1alpha1"
	flex "github.com/berth-io/berth/internal/flexvolume"
	"github.com/berth-io/berth/internal/testenv"
)

// TestMetricsCountFlexvolumeCalls: the real agent's /metrics counts the
// installed driver's calls through the agent socket (a real mount: loop
// device, mkfs, mounts; a refused second pod; the unmount) under their
// answer codes with one latency observation each, and the fence decisions
// behind them; the real operator's /metrics shows its attachment GC ran;
// both health endpoints answer.
func TestMetricsCountFlexvolumeCalls(t *testing.T) {
	f := setup(t)
	f.volume(t, "flex", "flex-metrics", v1.ReadWriteOncePod)
	uidA := f.pod(t, podSpec{ns: "default", name: "metrics-a", volume: inline("flex-metrics", "")})
	uidB := f.pod(t, podSpec{ns: "default", name: "metrics-b", volume: inline("flex-metrics", "")})
	before := testenv.ScrapeAddr(t, f.agentMetrics)

	res, _ := f.run(t, "mount", f.podDir(uidA, "flex-metrics"), options(t, "metrics-a", uidA, "flex-metrics"))
	want(t, "mount", res, flex.StatusSuccess)
	res, _ = f.run(t, "mount", f.podDir(uidB, "flex-metrics"), options(t, "metrics-b", uidB, "flex-metrics"))
	want(t, "second pod's mount of a ReadWriteOncePod volume", res, flex.StatusFailure)
	mounted := testenv.ScrapeAddr(t, f.agentMetrics)
	res, _ = f.run(t, "unmount", f.podDir(uidA, "flex-metrics"))
	want(t, "unmount", res, flex.StatusSuccess)
	after := testenv.ScrapeAddr(t, f.agentMetrics)

	delta := func(series string, want float64) {
		t.Helper()
		testenv.WantDelta(t, "agent", before, after, series, want)
	}
	req := func(op, code string) string {
		return testenv.Series("berth_flexvolume_requests_total", "operation", op, "code", code)
	}
	delta(req("mount", "OK"), 1)
	delta(req("mount", "FailedPrecondition"), 1)
	delta(req("unmount", "OK"), 1)
	delta(testenv.Series("berth_flexvolume_request_duration_seconds_count", "operation", "mount"), 2)
	delta(testenv.Series("berth_flexvolume_request_duration_seconds_count", "operation", "unmount"), 1)
	// The first mount's stage record and pod hold granted; the second
	// mount's stage record granted again (already held: a repeat), its
	// pod hold refused.
	delta(testenv.Series("berth_fence_acquires_total", "result", "granted"), 3)
	delta(testenv.Series("berth_fence_acquires_total", "result", "conflict"), 1)
	if n := mounted[testenv.Series("berth_volumes", "state", "Available", "transport", "loop")]; n < 1 {
		t.Errorf("berth_volumes{state=Available,transport=loop} = %v while mounted, want >= 1", n)
	}

	// The operator's GC ran its pass at start.
	op := testenv.ScrapeAddr(t, f.opMetrics)
	if op[testenv.Series("berth_attachment_gc_runs_total", "result", "ok")] < 1 || op["berth_attachment_gc_duration_seconds_count"] < 1 {
		t.Errorf("operator: attachment GC runs %v, durations %v; want at least one pass",
			op[testenv.Series("berth_attachment_gc_runs_total", "result", "ok")], op["berth_attachment_gc_duration_seconds_count"])
	}
	for _, addr := range []string{f.agentHealth, f.opHealth} {
		for _, path := range []string{"/healthz", "/readyz"} {
			testenv.WantOK(t, "http://"+addr+path)
		}
	}
}
