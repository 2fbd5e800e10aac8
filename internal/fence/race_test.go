package fence_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/record"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/berth-io/berth/api/v1alpha1"
	"github.com/berth-io/berth/internal/fence"
	"github.com/berth-io/berth/internal/testenv"
)

const (
	raceNodes      = 4    // contender i runs on node i%raceNodes: RWO allows same-node pairs
	injectRate     = 0.05 // share of writes that lose an injected race
	raceMaxRetries = 40
	rwxEvery       = 10 // RWX only proves that all hold: every 10th round is enough
)

// raceVolume is one volume every contender asks for in every round.
type raceVolume struct {
	name string
	mode v1.AccessMode
}

// raceNode is the node of contender id; each race has its own nodes.
func raceNode(prefix string, id int) string { return fmt.Sprintf("%s-node-%d", prefix, id%raceNodes) }

func raceVolumes(prefix string) []raceVolume {
	return []raceVolume{
		{prefix + "-rwo", v1.ReadWriteOnce},
		{prefix + "-rwop", v1.ReadWriteOncePod},
		{prefix + "-rwx", v1.ReadWriteMany},
	}
}

// contender tries every race volume once per round and releases what it won.
type contender interface {
	try(ctx context.Context, nvols int) (held []bool, err error) // the first nvols volumes
	release(ctx context.Context) error
	injected() (int64, error)
	close() error
}

// local is a contender in this process; helper processes run one each.
type local struct {
	id     int
	prefix string
	f      *fence.Fencer
	in     *injector
	vols   []raceVolume
	held   []bool
}

func newLocal(cfg *rest.Config, id int, prefix string) (*local, error) {
	cfg = rest.CopyConfig(cfg)
	cfg.QPS, cfg.Burst = 1000, 2000
	s, err := testenv.Scheme()
	if err != nil {
		return nil, err
	}
	c, err := client.NewWithWatch(cfg, client.Options{Scheme: s})
	if err != nil {
		return nil, err
	}
	in := &injector{rate: injectRate}
	// Events are dropped: refusals are the point of this test.
	f := fence.New(in.wrap(c), &record.FakeRecorder{}, clock.RealClock{}, logr.Discard(),
		fence.Options{MaxRetries: raceMaxRetries, MaxBackoff: 50 * time.Millisecond})
	return &local{id: id, prefix: prefix, f: f, in: in, vols: raceVolumes(prefix)}, nil
}

func (l *local) request(v raceVolume) fence.Request {
	uid := fmt.Sprintf("race-uid-%d", l.id)
	return fence.Request{
		Volume: v.name, Node: raceNode(l.prefix, l.id),
		PodNamespace: "default", Pod: fmt.Sprintf("race-pod-%d", l.id), PodUID: uid,
		MountDir:    "/var/lib/kubelet/pods/" + uid + "/volumes/kubernetes.io~csi/" + v.name + "/mount",
		StagingPath: "/var/lib/kubelet/plugins/berth.io/staging/" + v.name, AccessMode: v.mode,
	}
}

func (l *local) try(ctx context.Context, nvols int) ([]bool, error) {
	l.held = make([]bool, len(l.vols))
	errs := make([]error, nvols)
	var wg sync.WaitGroup
	for i, v := range l.vols[:nvols] {
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := l.f.Acquire(ctx, l.request(v))
			if err != nil && !fence.IsConflict(err) {
				errs[i] = fmt.Errorf("contender %d: %w", l.id, err)
			}
			l.held[i] = err == nil
		}()
	}
	wg.Wait()
	return l.held, errors.Join(errs...)
}

func (l *local) release(ctx context.Context) error {
	for i, v := range l.vols {
		if l.held[i] {
			r := l.request(v)
			if err := l.f.Release(ctx, r.Volume, r.Node, r.MountDir); err != nil {
				return fmt.Errorf("contender %d: %w", l.id, err)
			}
		}
	}
	return nil
}

func (l *local) injected() (int64, error) { return l.in.n.Load(), nil }
func (l *local) close() error             { return nil }

// tally counts what the rounds showed.
type tally struct {
	rounds, twoHolders, noHolder, rwxShort int
}

// checkRound judges one round: the contenders' own view and the API server's.
func checkRound(ctx context.Context, f *fence.Fencer, prefix string, vols []raceVolume, held [][]bool, t map[v1.AccessMode]*tally) error {
	vols = vols[:len(held[0])]
	listed, err := holdersOf(ctx, f, vols)
	if err != nil {
		return err
	}
	for vi, v := range vols {
		entries := listed[vi]
		tl := t[v.mode]
		tl.rounds++
		var nodes, pods []string // every holder, as the contenders and the API server see it
		n := 0
		for ci := range held {
			if held[ci][vi] {
				n++
				nodes = append(nodes, raceNode(prefix, ci))
				pods = append(pods, fmt.Sprintf("race-uid-%d", ci))
			}
		}
		if len(entries) != n {
			return fmt.Errorf("%s: contenders say %d hold, the Attachment lists %d", v.name, n, len(entries))
		}
		for _, e := range entries {
			nodes, pods = append(nodes, e.Node), append(pods, e.PodUID)
		}
		distinctNodes, distinctPods := len(distinct(nodes)), len(distinct(pods))
		switch v.mode {
		case v1.ReadWriteOnce:
			if distinctNodes > 1 {
				tl.twoHolders++
			}
		case v1.ReadWriteOncePod:
			if distinctPods > 1 || distinctNodes > 1 {
				tl.twoHolders++
			}
		case v1.ReadWriteMany:
			if n != len(held) {
				tl.rwxShort++
			}
		}
		if n == 0 {
			tl.noHolder++
		}
	}
	return nil
}

// race runs rounds: every contender tries every volume at once, the round is
// judged, the winners release, and the last release must delete each object.
func race(ctx context.Context, cs []contender, f *fence.Fencer, prefix string, rounds int) (map[v1.AccessMode]*tally, error) {
	vols := raceVolumes(prefix)
	t := map[v1.AccessMode]*tally{}
	for _, v := range vols {
		t[v.mode] = &tally{}
	}
	held := make([][]bool, len(cs))
	for r := 0; r < rounds; r++ {
		nvols := len(vols) - 1 // RWX is last
		if r%rwxEvery == 0 {
			nvols = len(vols)
		}
		if err := each(cs, func(i int, c contender) (err error) {
			held[i], err = c.try(ctx, nvols)
			if err == nil {
				held[i] = held[i][:nvols]
			}
			return err
		}); err != nil {
			return t, fmt.Errorf("round %d: %w", r, err)
		}
		if err := checkRound(ctx, f, prefix, vols, held, t); err != nil {
			return t, fmt.Errorf("round %d: %w", r, err)
		}
		if err := each(cs, func(_ int, c contender) error { return c.release(ctx) }); err != nil {
			return t, fmt.Errorf("round %d release: %w", r, err)
		}
		listed, err := holdersOf(ctx, f, vols[:nvols])
		if err != nil {
			return t, fmt.Errorf("round %d: %w", r, err)
		}
		for vi, hs := range listed {
			if len(hs) != 0 {
				return t, fmt.Errorf("round %d: %s still held after every release: %v", r, vols[vi].name, hs)
			}
		}
	}
	return t, nil
}

// holdersOf reads the volumes' Attachments at once.
func holdersOf(ctx context.Context, f *fence.Fencer, vols []raceVolume) ([][]v1.AttachmentEntry, error) {
	out := make([][]v1.AttachmentEntry, len(vols))
	errs := make([]error, len(vols))
	var wg sync.WaitGroup
	for i, v := range vols {
		wg.Add(1)
		go func() { defer wg.Done(); out[i], _, errs[i] = f.Holders(ctx, v.name) }()
	}
	wg.Wait()
	return out, errors.Join(errs...)
}

func each(cs []contender, fn func(int, contender) error) error {
	errs := make([]error, len(cs))
	var wg sync.WaitGroup
	for i, c := range cs {
		wg.Add(1)
		go func() { defer wg.Done(); errs[i] = fn(i, c) }()
	}
	wg.Wait()
	return errors.Join(errs...)
}

func mkRaceNodes(t *testing.T, prefix string) {
	for i := range raceNodes {
		n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: raceNode(prefix, i)}}
		if err := env.Client.Create(ctxT(t), n); err != nil && !isExists(err) {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = env.Client.Delete(context.Background(), n) })
	}
}

func raceRounds() int {
	if n, err := strconv.Atoi(os.Getenv("BERTH_FENCE_RACE_ROUNDS")); err == nil && n > 0 {
		return n
	}
	return 1000
}

func distinct(xs []string) map[string]bool {
	m := map[string]bool{}
	for _, x := range xs {
		m[x] = true
	}
	return m
}

func TestRaceGoroutines(t *testing.T) {
	suite.Require(t)
	t.Parallel() // independent of the process race: own volumes
	mkRaceNodes(t, "race-g")
	var cs []contender
	for i := range 8 {
		l, err := newLocal(env.Config, i, "race-g")
		if err != nil {
			t.Fatal(err)
		}
		cs = append(cs, l)
	}
	runRace(t, "goroutines", cs, "race-g")
}

func TestRaceProcesses(t *testing.T) {
	suite.Require(t)
	t.Parallel()
	mkRaceNodes(t, "race-p")
	kubeconfig, err := writeKubeconfig(env.Config, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	var cs []contender
	for i := range 8 {
		p, err := startProc(kubeconfig, i, "race-p")
		if err != nil {
			t.Fatal(err)
		}
		cs = append(cs, p)
		t.Cleanup(func() {
			if err := p.close(); err != nil {
				t.Errorf("contender process: %v", err)
			}
		})
	}
	runRace(t, "processes", cs, "race-p")
}

func runRace(t *testing.T, kind string, cs []contender, prefix string) {
	vols := raceVolumes(prefix)
	for _, v := range vols {
		cleanupVolume(t, v.name)
	}
	f, _ := newFencer(t)
	rounds := raceRounds()
	start := time.Now()
	tallies, err := race(ctxLong(t), cs, f, prefix, rounds)
	if err != nil {
		t.Fatal(err)
	}
	var injected int64
	for _, c := range cs {
		n, err := c.injected()
		if err != nil {
			t.Fatal(err)
		}
		injected += n
	}
	names := map[v1.AccessMode]string{v1.ReadWriteOnce: "RWO", v1.ReadWriteOncePod: "RWOP", v1.ReadWriteMany: "RWX"}
	for _, v := range vols {
		tl := tallies[v.mode]
		t.Logf("race %s %s: %d rounds, %d with two holders, %d with no holder, %d RWX rounds where not every contender held; %d contenders, %d injected conflicts in total, %s",
			kind, names[v.mode], tl.rounds, tl.twoHolders, tl.noHolder, tl.rwxShort, len(cs), injected, time.Since(start).Round(time.Millisecond))
		if tl.twoHolders != 0 || tl.noHolder != 0 || tl.rwxShort != 0 {
			t.Errorf("race %s %s failed: %+v", kind, names[v.mode], *tl)
		}
	}
}

// ctxLong bounds a race of 1000 rounds. It is a safety net, not a speed
// target: in CI the Go tests run beside a VM node, where 1000 rounds once
// took over 10 minutes; the package's own timeout is 30.
func ctxLong(t *testing.T) context.Context {
	return testenv.Context(t, 22*time.Minute)
}
