package heal_test

// Unit tests with fakes; the real path (a keeper, an agent process, blockdev
// servers SIGKILLed under writers) is test/userspace.

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/record"

	v1 "github.com/berth-io/berth/api/v1alpha1"
	"github.com/berth-io/berth/internal/agent"
	"github.com/berth-io/berth/internal/blockdev/launch"
	"github.com/berth-io/berth/internal/fence"
	"github.com/berth-io/berth/internal/heal"
)

type holdings []fence.Hold

func (h holdings) ListForNode(_ context.Context, node string) ([]fence.Hold, error) {
	var out []fence.Hold
	for _, x := range h {
		if x.Entry.Node == node {
			out = append(out, x)
		}
	}
	return out, nil
}

type outcome struct {
	res agent.HealResult
	err error
}

// volumes answers Heal from a table and checks that heals run at once.
type volumes struct {
	mu       sync.Mutex
	calls    map[string]int
	table    map[string]outcome
	inFlight atomic.Int32
	maxSeen  atomic.Int32
}

func (v *volumes) Heal(_ context.Context, id string) (*v1.Volume, agent.HealResult, error) {
	n := v.inFlight.Add(1)
	defer v.inFlight.Add(-1)
	for {
		m := v.maxSeen.Load()
		if n <= m || v.maxSeen.CompareAndSwap(m, n) {
			break
		}
	}
	time.Sleep(20 * time.Millisecond)
	v.mu.Lock()
	v.calls[id]++
	v.mu.Unlock()
	o, ok := v.table[id]
	if !ok {
		return nil, agent.HealSkipped, nil
	}
	return &v1.Volume{ObjectMeta: metav1.ObjectMeta{Name: id}}, o.res, o.err
}

func hold(vol, node, pod string) fence.Hold {
	return fence.Hold{Volume: vol, Entry: v1.AttachmentEntry{Node: node, Pod: pod, MountDir: "/m/" + vol + pod}}
}

func events(r *record.FakeRecorder) []string {
	var out []string
	for {
		select {
		case e := <-r.Events:
			out = append(out, e)
		default:
			return out
		}
	}
}

func TestPass(t *testing.T) {
	hs := holdings{hold("a", "n1", ""), hold("a", "n1", "pod"), hold("b", "n1", ""), hold("c", "n1", ""),
		hold("d", "n1", ""), hold("gone", "n1", ""), hold("other", "n2", "")}
	vols := &volumes{calls: map[string]int{}, table: map[string]outcome{
		"a": {res: agent.HealRestarted},
		"b": {res: agent.HealServing},
		"c": {err: fmt.Errorf("list: %w", agent.ErrKeeperDown)},
		"d": {err: fmt.Errorf("volume d: %w", agent.ErrConnectionLost)},
	}}
	rec := record.NewFakeRecorder(100)
	h := &heal.Healer{Node: "n1", Holdings: hs, Volumes: vols, Recorder: rec, Log: logr.Discard()}
	sum, err := h.Pass(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if sum[agent.HealRestarted] != 1 || sum[agent.HealServing] != 1 || sum[agent.HealSkipped] != 3 {
		t.Errorf("summary = %v", sum)
	}
	if vols.calls["a"] != 1 || vols.calls["other"] != 0 || len(vols.calls) != 5 {
		t.Errorf("healed %v; want each of this node's volumes once", vols.calls)
	}
	if vols.maxSeen.Load() < 2 {
		t.Errorf("volumes were healed one at a time")
	}
	got := strings.Join(events(rec), "\n")
	for _, want := range []string{"Normal " + heal.ReasonHealed, "Warning " + heal.ReasonKeeperDown + " node n1: the berth keeper is not running",
		"Warning " + heal.ReasonConnectionLost} {
		if !strings.Contains(got, want) {
			t.Errorf("events %q lack %q", got, want)
		}
	}
	// A lasting problem is reported once; a new restart is reported again.
	if _, err := h.Pass(context.Background()); err != nil {
		t.Fatal(err)
	}
	again := events(rec)
	if len(again) != 1 || !strings.Contains(again[0], heal.ReasonHealed) {
		t.Errorf("second pass events = %q, want only the restart", again)
	}
}

func TestWarningAgainAfterRecovery(t *testing.T) {
	vols := &volumes{calls: map[string]int{}, table: map[string]outcome{"a": {err: agent.ErrKeeperDown}}}
	rec := record.NewFakeRecorder(100)
	h := &heal.Healer{Node: "n1", Holdings: holdings{hold("a", "n1", "")}, Volumes: vols, Recorder: rec, Log: logr.Discard()}
	ctx := context.Background()
	pass := func() {
		if _, err := h.Pass(ctx); err != nil {
			t.Fatal(err)
		}
	}
	pass()
	vols.table["a"] = outcome{res: agent.HealServing}
	pass()
	vols.table["a"] = outcome{err: agent.ErrKeeperDown}
	pass()
	if n := len(events(rec)); n != 2 {
		t.Errorf("%d events, want one per outage (2)", n)
	}
}

func TestStartOnce(t *testing.T) {
	vols := &volumes{calls: map[string]int{}, table: map[string]outcome{}}
	h := &heal.Healer{Node: "n1", Holdings: holdings{hold("a", "n1", "")}, Volumes: vols, Log: logr.Discard()}
	if err := h.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	if vols.calls["a"] != 1 {
		t.Errorf("calls = %v", vols.calls)
	}
	if h.NeedLeaderElection() {
		t.Error("the healer must run on every node")
	}
}

// busyVolumes heals like agent.Heal: under the volume lock, waited for a
// bounded time.
type busyVolumes struct {
	locks *agent.VolumeLocks
	mu    sync.Mutex
	calls map[string]int
}

func (b *busyVolumes) Heal(ctx context.Context, id string) (*v1.Volume, agent.HealResult, error) {
	b.mu.Lock()
	b.calls[id]++
	b.mu.Unlock()
	ctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	unlock, err := b.locks.LockContext(ctx, id)
	if err != nil {
		return nil, agent.HealBusy, err
	}
	defer unlock()
	return &v1.Volume{ObjectMeta: metav1.ObjectMeta{Name: id}}, agent.HealRestarted, nil
}

// TestBusyVolumeSkipped: a volume whose lock an operation holds (stuck on
// a dead server) does not stop the pass; the others are healed, no warning
// is raised, and the busy one is tried again soon even with no Interval.
func TestBusyVolumeSkipped(t *testing.T) {
	locks := agent.NewVolumeLocks()
	unlock := locks.Lock("stuck")
	vols := &busyVolumes{locks: locks, calls: map[string]int{}}
	rec := record.NewFakeRecorder(100)
	h := &heal.Healer{Node: "n1", Holdings: holdings{hold("stuck", "n1", ""), hold("ok", "n1", "")},
		Volumes: vols, Recorder: rec, Log: logr.Discard(), BusyRetry: 50 * time.Millisecond}
	sum, err := h.Pass(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if sum[agent.HealBusy] != 1 || sum[agent.HealRestarted] != 1 {
		t.Fatalf("summary = %v, want one busy and one restarted", sum)
	}
	for _, e := range events(rec) {
		if strings.HasPrefix(e, "Warning") {
			t.Errorf("busy volume raised %q", e)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- h.Start(ctx) }()
	time.Sleep(300 * time.Millisecond)
	unlock()
	deadline := time.Now().Add(5 * time.Second)
	for {
		select {
		case err := <-done:
			// No Interval: Start ends after the pass that found nothing busy.
			if err != nil {
				t.Fatal(err)
			}
			vols.mu.Lock()
			n := vols.calls["stuck"]
			vols.mu.Unlock()
			if n < 3 {
				t.Errorf("busy volume tried %d times, want retries until it was free", n)
			}
			cancel()
			return
		case <-time.After(10 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			cancel()
			t.Fatal("Start did not retry the busy volume until it was free")
		}
	}
}

// TestGoneVolumeSkippedAndLogged: a staged volume whose Volume object or
// image is gone is skipped, said once in the log (and in a Warning on the
// Volume, when that still exists), and the other volumes are healed.
func TestGoneVolumeSkippedAndLogged(t *testing.T) {
	hs := holdings{hold("no-volume", "n1", ""), hold("no-image", "n1", ""), hold("fine", "n1", "")}
	vols := &volumes{calls: map[string]int{}, table: map[string]outcome{
		"no-volume": {res: agent.HealSkipped, err: fmt.Errorf("volume no-volume: %w", agent.ErrVolumeNotFound)},
		"no-image":  {res: agent.HealSkipped, err: fmt.Errorf("image of no-image: %w", agent.ErrVolumeNotFound)},
		"fine":      {res: agent.HealRestarted},
	}}
	var logged []string
	log := funcr.New(func(_, args string) { logged = append(logged, args) }, funcr.Options{})
	rec := record.NewFakeRecorder(100)
	h := &heal.Healer{Node: "n1", Holdings: hs, Volumes: gone{vols}, Recorder: rec, Log: log, Parallel: 1}
	for range 2 {
		sum, err := h.Pass(context.Background())
		if err != nil || sum[agent.HealSkipped] != 2 || sum[agent.HealRestarted] != 1 {
			t.Fatalf("pass = %v, %v; want 2 skipped, 1 restarted", sum, err)
		}
	}
	var goneLogs int
	for _, l := range logged {
		if strings.Contains(l, "Volume object or image is gone") {
			goneLogs++
		}
	}
	if goneLogs != 2 {
		t.Errorf("%d log lines about gone volumes over two passes, want one per volume: %q", goneLogs, logged)
	}
	got := strings.Join(events(rec), "\n")
	if strings.Count(got, "Warning "+heal.ReasonVolumeGone) != 1 || !strings.Contains(got, "no-image") {
		t.Errorf("events %q: want one %s Warning, on the Volume whose image is gone", got, heal.ReasonVolumeGone)
	}
}

// gone is volumes whose "no-volume" has no Volume object to return.
type gone struct{ *volumes }

func (g gone) Heal(ctx context.Context, id string) (*v1.Volume, agent.HealResult, error) {
	vol, res, err := g.volumes.Heal(ctx, id)
	if id == "no-volume" {
		vol = nil
	}
	return vol, res, err
}

// downHoldings fails as an API server that does not answer.
type downHoldings struct{}

func (downHoldings) ListForNode(context.Context, string) ([]fence.Hold, error) {
	return nil, fmt.Errorf("list Attachments: connection refused")
}

// TestPassHealsLocalRecordsWhenAttachmentsCannotBeListed: with the API
// server away, a pass heals the volumes the agent's own records name, and
// still reports the failed listing; without Local it heals nothing.
func TestPassHealsLocalRecordsWhenAttachmentsCannotBeListed(t *testing.T) {
	v := &volumes{calls: map[string]int{}, table: map[string]outcome{
		"a": {res: agent.HealRestarted}, "b": {res: agent.HealServing},
	}}
	h := &heal.Healer{Node: "n1", Holdings: downHoldings{}, Volumes: v, Log: logr.Discard(),
		Local: func() ([]string, error) { return []string{"a", "b"}, nil }}
	sum, err := h.Pass(context.Background())
	if err == nil || !strings.Contains(err.Error(), "connection refused") {
		t.Errorf("Pass error = %v; want the failed listing", err)
	}
	if sum[agent.HealRestarted] != 1 || sum[agent.HealServing] != 1 || v.calls["a"] != 1 || v.calls["b"] != 1 {
		t.Errorf("Pass = %v, calls %v; want a restarted and b serving, each healed once", sum, v.calls)
	}

	v = &volumes{calls: map[string]int{}, table: map[string]outcome{"a": {res: agent.HealRestarted}}}
	h = &heal.Healer{Node: "n1", Holdings: downHoldings{}, Volumes: v, Log: logr.Discard()}
	if _, err := h.Pass(context.Background()); err == nil || len(v.calls) != 0 {
		t.Errorf("Pass without Local = %v, calls %v; want the error and no heal", err, v.calls)
	}
}

// TestPassHealsLocalFirstAndOnce: a volume both the local records and the
// Attachments name is healed once, in the local phase.
func TestPassHealsLocalFirstAndOnce(t *testing.T) {
	v := &volumes{calls: map[string]int{}, table: map[string]outcome{
		"a": {res: agent.HealRestarted}, "b": {res: agent.HealRestarted},
	}}
	h := &heal.Healer{Node: "n1", Holdings: holdings{hold("a", "n1", ""), hold("b", "n1", "")}, Volumes: v, Log: logr.Discard(),
		Local: func() ([]string, error) { return []string{"a"}, nil }}
	sum, err := h.Pass(context.Background())
	if err != nil || sum[agent.HealRestarted] != 2 || v.calls["a"] != 1 || v.calls["b"] != 1 {
		t.Errorf("Pass = %v, %v, calls %v; want a and b restarted, each once", sum, err, v.calls)
	}
}

// groupVolumes records the hold group each heal ran under.
type groupVolumes struct {
	mu     sync.Mutex
	groups map[string]*launch.HoldGroup
}

func (g *groupVolumes) Heal(ctx context.Context, id string) (*v1.Volume, agent.HealResult, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.groups[id] = launch.HoldFrom(ctx)
	return nil, agent.HealRestarted, nil
}

// TestPassHoldsEachStepTogether: the servers a pass starts resume their
// I/O together, the local volumes' apart from those the Attachments name
// (which wait for the API server).
func TestPassHoldsEachStepTogether(t *testing.T) {
	g := &groupVolumes{groups: map[string]*launch.HoldGroup{}}
	h := &heal.Healer{Node: "n1", Holdings: holdings{hold("a", "n1", ""), hold("b", "n1", ""), hold("c", "n1", "")}, Volumes: g, Log: logr.Discard(),
		Local: func() ([]string, error) { return []string{"a"}, nil }}
	if _, err := h.Pass(context.Background()); err != nil {
		t.Fatal(err)
	}
	a, b, c := g.groups["a"], g.groups["b"], g.groups["c"]
	if a == nil || b == nil || a == b || b != c {
		t.Fatalf("hold groups a %p, b %p, c %p: want a of its own, b and c one", a, b, c)
	}
}
