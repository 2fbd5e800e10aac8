package fence

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/berth-io/berth/api/v1alpha1"
	"github.com/berth-io/berth/internal/metrics"
)

// DefaultGCInterval applies when no StorageCluster sets spec.attachmentGC.interval.
const DefaultGCInterval = 24 * time.Hour

// GC is the operator's periodic sweep of all Attachments. It runs at start
// and then every interval, the smallest spec.attachmentGC.interval across
// StorageClusters (re-read after each wait and whenever Wake says a
// StorageCluster changed, so a shorter interval applies at once). Rules,
// per entry:
//
//   - its node object is gone: the entry moves to the node's stale list, a
//     pod entry as well as a stage record (as lock breaking does): a machine
//     that re-registers under the same name must undo the bind mounts and
//     the device, and kubelet's orphan cleanup may never call berth for a
//     pod it no longer knows;
//   - its pod is gone (not found, or a different UID under that name) on a
//     live node: it moves to that node's stale list, so that the agent there
//     unmounts what kubelet never unpublished;
//   - anything else stays.
//
// An Attachment left with no entry is deleted. Node labels of nodes that
// hold no entry are dropped (an agent may have had to keep them,
// setNodeLabels). A stale list (NodeCleanup) whose node object has been
// gone for longer than Options.StaleListTTL is deleted: no agent will
// ever work it off. The GC marks when it first saw the node gone
// (annotation NodeGoneSinceAnnotation) and lifts the mark when the node
// is back.
type GC struct {
	c    client.Client
	clk  clock.Clock
	log  logr.Logger
	opts Options
	// wake has Start read the interval again (Wake); lost starts a burst
	// of passes (NodeLost).
	wake, lost chan struct{}

	m *metrics.GC
}

// NodeGoneSinceAnnotation on a NodeCleanup records when the GC first found
// its node object gone (RFC 3339).
const NodeGoneSinceAnnotation = "berth.io/node-gone-since"

// NewGC returns the GC and registers its metrics (internal/metrics.GC) on
// reg (controller-runtime's metrics.Registry in the operator).
func NewGC(c client.Client, clk clock.Clock, log logr.Logger, reg prometheus.Registerer, opts Options) (*GC, error) {
	m, err := metrics.NewGC(reg)
	if err != nil {
		return nil, err
	}
	return &GC{c: c, clk: clk, log: log, opts: opts.withDefaults(), wake: make(chan struct{}, 1), lost: make(chan struct{}, 1), m: m}, nil
}

// GCResult counts what one pass did.
type GCResult struct {
	Scanned, Moved, Dropped, Pruned int
	// Skipped entries could not be judged (invalid pod fields, a failed
	// lookup) and stay where they are until a later pass.
	Skipped int
}

// Start runs a pass at once and then every interval until ctx ends
// (controller-runtime manager.Runnable). Wake makes it read the interval
// again at once: a StorageCluster made or changed after the operator
// started must not wait out the default day before its interval applies.
// NodeLost adds a burst of passes (lostNodeBurst).
func (g *GC) Start(ctx context.Context) error {
	last := g.pass(ctx)
	var burst []time.Time // passes asked for by NodeLost, in order
	for {
		interval, err := g.Interval(ctx)
		if err != nil {
			g.log.Error(err, "read attachment GC interval; using the default", "default", DefaultGCInterval)
		}
		wait := interval - g.clk.Since(last)
		if len(burst) > 0 {
			wait = min(wait, burst[0].Sub(g.clk.Now()))
		}
		if wait <= 0 {
			last = g.pass(ctx)
			// A burst pass that fell due during this one is still owed:
			// this pass read the world before it.
			for len(burst) > 0 && !burst[0].After(last) {
				burst = burst[1:]
			}
			continue
		}
		select {
		case <-ctx.Done():
			return nil
		case <-g.clk.After(wait):
		case <-g.wake:
		case <-g.lost:
			now := g.clk.Now()
			burst = burst[:0]
			for _, d := range lostNodeBurst {
				burst = append(burst, now.Add(d))
			}
		}
	}
}

// lostNodeBurst is when, after NodeLost, the GC passes: at once, then
// while Kubernetes force-deletes the lost node's pods (its pod GC does so
// for an out-of-service node within about a minute), each pass moving the
// holds of the pods gone by then.
var lostNodeBurst = [...]time.Duration{0, 10 * time.Second, 20 * time.Second, 40 * time.Second, 80 * time.Second, 160 * time.Second}

// NodeLost asks for the lostNodeBurst of passes: a node was tainted
// out-of-service or its Node deleted, and the holds of its pods should
// move as soon as the pods are gone, not a GC interval later (a day by
// default). It never blocks.
func (g *GC) NodeLost() {
	select {
	case g.lost <- struct{}{}:
	default:
	}
}

// pass runs one sweep, logs it and returns when it started.
func (g *GC) pass(ctx context.Context) time.Time {
	start := g.clk.Now()
	res, err := g.RunOnce(ctx)
	if err != nil {
		g.log.Error(err, "attachment GC pass failed")
	} else {
		g.log.Info("attachment GC pass", "scanned", res.Scanned, "moved", res.Moved, "dropped", res.Dropped, "pruned", res.Pruned)
	}
	return start
}

// Wake tells a waiting Start that the interval may have changed (a
// StorageCluster was made, changed or deleted); it never blocks.
func (g *GC) Wake() {
	select {
	case g.wake <- struct{}{}:
	default:
	}
}

// NeedLeaderElection is true: one operator replica sweeps.
func (g *GC) NeedLeaderElection() bool { return true }

// Interval is the smallest spec.attachmentGC.interval across StorageClusters,
// DefaultGCInterval when none sets one (or on error).
func (g *GC) Interval(ctx context.Context) (time.Duration, error) {
	var list v1.StorageClusterList
	if err := g.c.List(ctx, &list); err != nil {
		return DefaultGCInterval, fmt.Errorf("list storageclusters: %w", err)
	}
	interval := time.Duration(0)
	for _, sc := range list.Items {
		if iv := sc.Spec.AttachmentGC.Interval; iv != nil && iv.Duration > 0 && (interval == 0 || iv.Duration < interval) {
			interval = iv.Duration
		}
	}
	if interval == 0 {
		return DefaultGCInterval, nil
	}
	return interval, nil
}

// RunOnce sweeps every Attachment once.
func (g *GC) RunOnce(ctx context.Context) (GCResult, error) {
	start := g.clk.Now()
	res, err := g.runOnce(ctx)
	g.m.Run(err, g.clk.Since(start))
	return res, err
}

func (g *GC) runOnce(ctx context.Context) (GCResult, error) {
	var res GCResult
	var list v1.AttachmentList
	if err := g.c.List(ctx, &list); err != nil {
		return res, fmt.Errorf("list attachments: %w", err)
	}
	w := &gcWorld{c: g.c, nodes: map[string]bool{}}
	// One Attachment the GC cannot work on (an API error, a bad object)
	// must not stop the pass: every other one, and the pruning, go on.
	var errs []error
	for _, att := range list.Items {
		res.Scanned += len(att.Spec.Attachments)
		moved, dropped, skipped, err := g.sweep(ctx, w, att.Name)
		if err != nil {
			g.log.Error(err, "attachment GC could not sweep an Attachment; the pass goes on", "volume", att.Name)
			errs = append(errs, err)
		}
		g.m.Entries(len(att.Spec.Attachments), moved, dropped, skipped)
		res.Moved += moved
		res.Dropped += dropped
		res.Skipped += skipped
	}
	pruned, err := g.pruneStaleLists(ctx, w)
	res.Pruned = pruned
	g.m.Pruned(pruned)
	return res, errors.Join(append(errs, err)...)
}

// pruneStaleLists marks the stale lists of gone nodes, unmarks those of
// nodes that are back, and deletes those marked longer than the TTL ago.
func (g *GC) pruneStaleLists(ctx context.Context, w *gcWorld) (int, error) {
	var list v1.NodeCleanupList
	if err := g.c.List(ctx, &list); err != nil {
		return 0, fmt.Errorf("list nodecleanups: %w", err)
	}
	pruned := 0
	now := g.clk.Now()
	var errs []error
	for i := range list.Items {
		nc := &list.Items[i]
		n, err := g.pruneStaleList(ctx, w, nc, now)
		if err != nil {
			g.log.Error(err, "attachment GC could not prune a stale list; the pass goes on", "node", nc.Name)
			errs = append(errs, err)
		}
		pruned += n
	}
	return pruned, errors.Join(errs...)
}

// pruneStaleList marks, unmarks or deletes one stale list; 1 when deleted.
func (g *GC) pruneStaleList(ctx context.Context, w *gcWorld, nc *v1.NodeCleanup, now time.Time) (int, error) {
	live, err := w.nodeExists(ctx, nc.Name)
	if err != nil {
		return 0, err
	}
	since, marked := nc.Annotations[NodeGoneSinceAnnotation]
	switch {
	case live && marked:
		delete(nc.Annotations, NodeGoneSinceAnnotation)
		if err := g.c.Update(ctx, nc); err != nil && !raced(err) {
			return 0, fmt.Errorf("unmark nodecleanup %s: %w", nc.Name, err)
		}
		return 0, nil
	case live:
		return 0, nil
	case !marked:
		if nc.Annotations == nil {
			nc.Annotations = map[string]string{}
		}
		nc.Annotations[NodeGoneSinceAnnotation] = now.UTC().Format(time.RFC3339)
		if err := g.c.Update(ctx, nc); err != nil && !raced(err) {
			return 0, fmt.Errorf("mark nodecleanup %s: %w", nc.Name, err)
		}
		return 0, nil
	}
	t, err := time.Parse(time.RFC3339, since)
	if err == nil && now.Sub(t) < g.opts.StaleListTTL {
		return 0, nil
	}
	// A mark that does not parse was not written by us: start over
	// rather than delete on it.
	if err != nil {
		nc.Annotations[NodeGoneSinceAnnotation] = now.UTC().Format(time.RFC3339)
		if err := g.c.Update(ctx, nc); err != nil && !raced(err) {
			return 0, fmt.Errorf("mark nodecleanup %s: %w", nc.Name, err)
		}
		return 0, nil
	}
	if _, err := deleteIfUnchanged(ctx, g.c, nc); err != nil {
		return 0, err
	}
	g.log.Info("stale list pruned: its node is gone", "node", nc.Name, "goneSince", since,
		"entries", len(nc.Spec.Entries), "ttl", g.opts.StaleListTTL)
	return 1, nil
}

// sweep applies the rules to one Attachment, re-reading it after a lost race.
func (g *GC) sweep(ctx context.Context, w *gcWorld, volume string) (moved, dropped, skipped int, err error) {
	err = retry(ctx, g.clk, g.opts, "gc "+volume, func() (bool, error) {
		moved, dropped, skipped = 0, 0, 0
		var att v1.Attachment
		if found, err := lookup(ctx, g.c, "attachment", client.ObjectKey{Name: volume}, &att); !found {
			return true, err
		}
		kept := att.Spec.Attachments[:0:0]
		stale := map[string][]v1.StaleAttachment{}
		var order []string
		for _, e := range att.Spec.Attachments {
			reason, move, drop, err := w.judge(ctx, &e)
			if err != nil {
				// The entry stays for a later pass; the others of this
				// Attachment and of every other are judged still.
				g.log.Error(err, "attachment GC skips an entry it cannot judge", "volume", volume,
					"node", e.Node, "pod", e.PodNamespace+"/"+e.Pod, "podUID", e.PodUID)
				if g.opts.Events != nil {
					g.opts.Events.Eventf(&att, corev1.EventTypeWarning, ReasonGCEntrySkipped,
						"attachment GC leaves the entry of node %s, mount dir %s: %v", e.Node, e.MountDir, err)
				}
				skipped++
				kept = append(kept, e)
				continue
			}
			switch {
			case move && reason == v1.ReasonNodeGone && len(cephClients(&att, e.Node)) > 0 && g.opts.Blocklister == nil:
				// A gone node's Ceph clients must be blocklisted first, and
				// this GC cannot: lock breaking will, when a node asks.
				g.log.V(1).Info("attachment GC leaves an entry with Ceph clients to lock breaking", "volume", volume, "node", e.Node)
				kept = append(kept, e)
			case move:
				if _, ok := stale[e.Node]; !ok {
					order = append(order, e.Node)
				}
				stale[e.Node] = append(stale[e.Node], staleFrom(volume, e, reason, g.clk))
				moved++
			case drop:
				dropped++
			default:
				kept = append(kept, e)
			}
		}
		// Node labels an agent had to keep (setNodeLabels) go with any
		// write, or alone.
		if len(kept) == len(att.Spec.Attachments) && len(kept) > 0 && !staleNodeLabels(&att) {
			return true, nil
		}
		// Stale lists first: a crash before the Attachment update leaves
		// entries the cleaner finds still held and drops.
		for _, node := range order {
			// Only a gone node loses the volume itself (a live node's gone
			// pod loses its bind mount): only its clients are fenced.
			var addrs []string
			if !w.nodes[node] {
				addrs = cephClients(&att, node)
			}
			if err := addStale(ctx, g.c, g.clk, g.opts, node, stale[node], blocklisted(volume, addrs, v1.ReasonNodeGone, g.clk)); err != nil {
				return true, err
			}
			if len(addrs) > 0 {
				if err := fenceClients(ctx, g.opts.Blocklister, nil, volume, node, v1.ReasonNodeGone, addrs); err != nil {
					return true, err
				}
				g.log.Info("ceph clients blocklisted", "volume", volume, "node", node, "addresses", addrs)
			}
		}
		done, err := keepEntries(ctx, g.c, &att, kept, g.opts.exactLabels())
		if done && err == nil {
			g.log.Info("attachment GC", "volume", volume, "moved", moved, "dropped", dropped, "left", len(kept))
		}
		return done, err
	})
	return moved, dropped, skipped, err
}

// gcWorld answers node and pod questions, caching nodes within one pass.
type gcWorld struct {
	c     client.Client
	nodes map[string]bool // name -> exists
}

func (w *gcWorld) nodeExists(ctx context.Context, name string) (bool, error) {
	if ok, seen := w.nodes[name]; seen {
		return ok, nil
	}
	err := w.c.Get(ctx, client.ObjectKey{Name: name}, &corev1.Node{})
	if err != nil && !apierrors.IsNotFound(err) {
		return false, fmt.Errorf("get node %s: %w", name, err)
	}
	w.nodes[name] = err == nil
	return err == nil, nil
}

// judge applies the GC rules to one entry.
func (w *gcWorld) judge(ctx context.Context, e *v1.AttachmentEntry) (reason v1.CleanupReason, move, drop bool, err error) {
	live, err := w.nodeExists(ctx, e.Node)
	if err != nil {
		return "", false, false, err
	}
	if !live {
		return v1.ReasonNodeGone, true, false, nil
	}
	if e.IsStage() {
		return "", false, false, nil
	}
	if err := checkPod(e); err != nil {
		return "", false, false, err
	}
	var p corev1.Pod
	err = w.c.Get(ctx, client.ObjectKey{Namespace: e.PodNamespace, Name: e.Pod}, &p)
	switch {
	case apierrors.IsNotFound(err):
		return v1.ReasonPodGone, true, false, nil
	case err != nil:
		return "", false, false, fmt.Errorf("get pod %s/%s: %w", e.PodNamespace, e.Pod, err)
	case string(p.UID) != e.PodUID:
		return v1.ReasonPodGone, true, false, nil
	}
	return "", false, false, nil
}

// ReasonGCEntrySkipped is the Event reason on an Attachment whose entry
// the GC could not judge and left in place.
const ReasonGCEntrySkipped = "GCEntrySkipped"

// errInvalidEntry: an Attachment entry names a pod no pod can be (stored
// before the CRD checked the pod fields, or past its checks).
var errInvalidEntry = errors.New("invalid attachment entry")

// podUID is the CRD's rule for AttachmentEntry.PodUID.
var podUID = regexp.MustCompile(`^[0-9A-Za-z-]{0,128}$`)

// checkPod applies the CRD's pod field rules, so that a pod lookup is asked
// only about a name a pod can have.
func checkPod(e *v1.AttachmentEntry) error {
	bad := validation.IsDNS1123Label(e.PodNamespace)
	bad = append(bad, validation.IsDNS1123Subdomain(e.Pod)...)
	if !podUID.MatchString(e.PodUID) {
		bad = append(bad, "the pod UID may hold only letters, digits and dashes, at most 128")
	}
	if len(bad) > 0 {
		return fmt.Errorf("%w: pod %q in namespace %q, uid %q: %s", errInvalidEntry, e.Pod, e.PodNamespace, e.PodUID, strings.Join(bad, "; "))
	}
	return nil
}
