package metrics_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/berth-io/berth/internal/metrics"
	"github.com/berth-io/berth/internal/testenv"
	"github.com/berth-io/berth/internal/version"
)

// TestNilGroupsRecordNothing: code built without metrics calls the same
// methods on nil groups.
func TestNilGroupsRecordNothing(t *testing.T) {
	var (
		ops *metrics.Ops
		f   *metrics.Fence
		g   *metrics.GC
		c   *metrics.Cleanup
		h   *metrics.Heal
		d   *metrics.FlexDriver
		s   *metrics.Share
		p   *metrics.Pools
	)
	s.FailedOver("PodFailed")
	s.Recovered(time.Second)
	p.Set("c", 1, 1)
	p.Keep(nil)
	ops.Observe("mount", "OK", time.Second)
	f.Acquired(metrics.AcquireGranted, time.Second)
	f.Released(nil)
	f.Broke("NodeGone")
	g.Run(nil, time.Second)
	g.Entries(1, 1, 1, 1)
	g.Pruned(1)
	c.Pass(nil, 1, 1, 1, 1)
	h.Pass(nil)
	h.Volume("restarted", time.Second)
	d.Set(true)
}

// TestRegisterAllOrNothing: a group that cannot register (its names taken)
// fails with AlreadyRegistered and leaves the registry as it was.
func TestRegisterAllOrNothing(t *testing.T) {
	reg := prometheus.NewRegistry()
	// Takes one of the GC's names, not the first.
	if err := reg.Register(prometheus.NewCounter(prometheus.CounterOpts{Name: "berth_attachment_gc_entries_moved_total",
		Help: "Attachment entries the GC moved to a node's stale list."})); err != nil {
		t.Fatal(err)
	}
	if _, err := metrics.NewGC(reg); !metrics.IsAlreadyRegistered(err) {
		t.Fatalf("NewGC over a taken name: %v, want AlreadyRegistered", err)
	}
	got, err := testenv.Gathered(reg)
	if err != nil {
		t.Fatal(err)
	}
	if _, left := got[testenv.Series("berth_attachment_gc_runs_total", "result", "ok")]; left || len(got) != 1 {
		t.Errorf("registry after the failed registration: %v", got)
	}
	if _, err := metrics.NewOps(reg, metrics.BoundaryCSI); err != nil {
		t.Fatal(err)
	}
	if _, err := metrics.NewOps(reg, metrics.BoundaryFlexvolume); err != nil {
		t.Errorf("second boundary on one registry: %v", err)
	}
}

type fakeNode struct {
	volumes []metrics.VolumeCount
	volErr  error
	conns   int
	keepErr error
	// ioErrors per volume, or ioErr.
	ioErrors map[string]uint64
	ioErr    error
	dirs     []metrics.DataDirUsage
	dirsErr  error
}

func (f *fakeNode) DataDirs(context.Context) ([]metrics.DataDirUsage, error) {
	return f.dirs, f.dirsErr
}

func (f *fakeNode) VolumeCounts(context.Context) ([]metrics.VolumeCount, error) {
	return f.volumes, f.volErr
}
func (f *fakeNode) KeeperConnections(context.Context) (int, error) { return f.conns, f.keepErr }
func (f *fakeNode) BlockdevIOErrors(context.Context) (map[string]uint64, error) {
	return f.ioErrors, f.ioErr
}

// TestBlockdevIOErrorsStayMonotonic: the node's counter is the staged
// volumes' counts plus the last counts of those unstaged, and a count
// that cannot be read keeps its last value.
func TestBlockdevIOErrorsStayMonotonic(t *testing.T) {
	reg := prometheus.NewRegistry()
	src := &fakeNode{}
	if _, err := metrics.NewNode(reg, src, logr.Discard()); err != nil {
		t.Fatal(err)
	}
	for _, step := range []struct {
		name   string
		counts map[string]uint64
		err    error
		want   float64
	}{
		{"none staged", nil, nil, 0},
		{"two volumes", map[string]uint64{"a": 3, "b": 2}, nil, 5},
		{"b unstaged, a failed once more", map[string]uint64{"a": 4}, nil, 6},
		{"a staged anew", map[string]uint64{"a": 1}, nil, 7},
		{"a unreadable", map[string]uint64{}, errors.New("read a: EIO"), 7},
		{"c staged", map[string]uint64{"a": 1, "c": 1}, nil, 8},
	} {
		src.ioErrors, src.ioErr = step.counts, step.err
		got, err := testenv.Gathered(reg)
		if err != nil {
			t.Fatal(err)
		}
		if n := got["berth_blockdev_io_errors_total"]; n != step.want {
			t.Errorf("%s: %v, want %v", step.name, n, step.want)
		}
	}
}

// TestNodeGaugesReadAtScrape: the node gauges show what the source says at
// each scrape; a source that fails leaves its gauges out without failing
// the scrape, and a keeper that does not answer reads as keeper_up 0.
func TestNodeGaugesReadAtScrape(t *testing.T) {
	reg := prometheus.NewRegistry()
	src := &fakeNode{
		volumes: []metrics.VolumeCount{{State: "Available", Transport: "loop", N: 2}, {State: "Available", Transport: "fuse", N: 1}},
		conns:   1,
		dirs:    []metrics.DataDirUsage{{Dir: "/var/lib/berth/data", Size: 100, Free: 40, Promised: 80, Allocated: 55}},
	}
	if _, err := metrics.NewNode(reg, src, logr.Discard()); err != nil {
		t.Fatal(err)
	}
	got, err := testenv.Gathered(reg)
	if err != nil {
		t.Fatal(err)
	}
	dir := func(name string) string { return testenv.Series(name, "dir", "/var/lib/berth/data") }
	for s, n := range map[string]float64{
		testenv.Series("berth_volumes", "state", "Available", "transport", "loop"): 2,
		testenv.Series("berth_volumes", "state", "Available", "transport", "fuse"): 1,
		"berth_keeper_up": 1, "berth_keeper_connections": 1,
		dir("berth_data_dir_size_bytes"): 100, dir("berth_data_dir_free_bytes"): 40,
		dir("berth_data_dir_promised_bytes"): 80, dir("berth_data_dir_allocated_bytes"): 55,
	} {
		if got[s] != n {
			t.Errorf("%s = %v, want %v", s, got[s], n)
		}
	}
	src.volErr, src.keepErr, src.volumes = errors.New("cache not synced"), errors.New("keeper down"), nil
	src.ioErr = errors.New("userspace root unreadable")
	src.dirs, src.dirsErr = nil, errors.New("statfs: EIO")
	got, err = testenv.Gathered(reg)
	if err != nil {
		t.Fatalf("scrape with failing sources: %v", err)
	}
	if len(got) != 1 || got["berth_keeper_up"] != 0 {
		t.Errorf("scrape with failing sources: %v, want only berth_keeper_up 0", got)
	}
}

// TestHTTPEndpoints serves metrics and health on real listeners: /metrics
// has the registry's series, /readyz follows the ready check, and Serve
// returns when its context ends.
func TestHTTPEndpoints(t *testing.T) {
	reg := prometheus.NewRegistry()
	ops, err := metrics.NewOps(reg, metrics.BoundaryCSI)
	if err != nil {
		t.Fatal(err)
	}
	ops.Observe("CreateVolume", "OK", time.Millisecond)
	ml, err := metrics.Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hl, err := metrics.Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var ready atomic.Bool
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 2)
	go func() { done <- metrics.Serve(ctx, ml, metrics.Handler(reg)) }()
	go func() {
		done <- metrics.Serve(ctx, hl, metrics.HealthHandler(func() error {
			if !ready.Load() {
				return errors.New("not yet")
			}
			return nil
		}))
	}()

	scraped, err := testenv.Scrape(context.Background(), "http://"+ml.Addr().String()+"/metrics")
	if err != nil || scraped[testenv.Series("berth_csi_requests_total", "operation", "CreateVolume", "code", "OK")] != 1 {
		t.Errorf("scrape: %v, %v", scraped, err)
	}
	get := func(path string) int {
		resp, err := http.Get("http://" + hl.Addr().String() + path)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
		return resp.StatusCode
	}
	if code := get("/healthz"); code != http.StatusOK {
		t.Errorf("/healthz: %d", code)
	}
	if code := get("/readyz"); code != http.StatusServiceUnavailable {
		t.Errorf("/readyz while not ready: %d", code)
	}
	ready.Store(true)
	if code := get("/readyz"); code != http.StatusOK {
		t.Errorf("/readyz when ready: %d", code)
	}
	cancel()
	for range 2 {
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	}
	if l, err := metrics.Listen(metrics.Disabled); l != nil || err != nil {
		t.Errorf("Listen(%q) = %v, %v; want nothing", metrics.Disabled, l, err)
	}
	if err := metrics.Serve(ctx, nil, nil); err != nil || !strings.Contains(ctx.Err().Error(), "canceled") {
		t.Errorf("Serve of a disabled endpoint after cancel: %v", err)
	}
}

// TestPoolsKeep: a pool's gauges stay until its cluster is no longer kept.
func TestPoolsKeep(t *testing.T) {
	reg := prometheus.NewRegistry()
	p, err := metrics.NewPools(reg)
	if err != nil {
		t.Fatal(err)
	}
	p.Set("a", 10, 4)
	p.Set("b", 20, 8)
	p.Keep(map[string]bool{"a": true})
	got, err := testenv.Gathered(reg)
	if err != nil {
		t.Fatal(err)
	}
	free, used := testenv.Series("berth_ceph_pool_free_bytes", "storage_cluster", "a"), testenv.Series("berth_ceph_pool_used_bytes", "storage_cluster", "a")
	if len(got) != 2 || got[free] != 10 || got[used] != 4 {
		t.Errorf("after keeping a: %v, want a's free 10 and used 4 only", got)
	}
}

// TestBuildInfo: one series of value 1 naming the build.
func TestBuildInfo(t *testing.T) {
	reg := prometheus.NewRegistry()
	if err := metrics.NewBuildInfo(reg, version.Info{Version: "v0.2.0", Commit: "abc1234", GoVersion: "go1.24.4", Ceph: true}); err != nil {
		t.Fatal(err)
	}
	got, err := testenv.Gathered(reg)
	if err != nil {
		t.Fatal(err)
	}
	want := testenv.Series("berth_build_info", "ceph", "true", "commit", "abc1234", "goversion", "go1.24.4", "version", "v0.2.0")
	if len(got) != 1 || got[want] != 1 {
		t.Errorf("build info: %v, want %s 1", got, want)
	}
}

type fakeShares struct {
	counts map[string]int
	err    error
}

func (f *fakeShares) ShareStates(context.Context) (map[string]int, error) { return f.counts, f.err }

// TestShareStates: every named state has a series, zero or not, a state
// not named gets one too, and a failing source leaves them out.
func TestShareStates(t *testing.T) {
	reg := prometheus.NewRegistry()
	src := &fakeShares{counts: map[string]int{"running": 2, "odd": 1}}
	if _, err := metrics.NewShareStates(reg, src, logr.Discard(), "running", "error"); err != nil {
		t.Fatal(err)
	}
	got, err := testenv.Gathered(reg)
	if err != nil {
		t.Fatal(err)
	}
	state := func(s string) string { return testenv.Series("berth_shares", "state", s) }
	if len(got) != 3 || got[state("running")] != 2 || got[state("odd")] != 1 {
		t.Errorf("share states: %v", got)
	}
	if v, ok := got[state("error")]; !ok || v != 0 {
		t.Errorf("error state: %v, %t; want a zero series", v, ok)
	}
	src.err = errors.New("cache not synced")
	if got, err = testenv.Gathered(reg); err != nil || len(got) != 0 {
		t.Errorf("scrape with a failing source: %v, %v; want no series", got, err)
	}
}
