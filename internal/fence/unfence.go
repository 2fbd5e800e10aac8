package fence

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/record"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/berth-io/berth/api/v1alpha1"
)

// Event reasons of taking a node's clients off the blocklist.
const (
	EventUnblocklisted       = "FenceUnblocklisted"
	EventUnblocklistFailed   = "FenceUnblocklistFailed"
	DefaultUnfenceCooldown   = 5 * time.Minute
	DefaultUnfenceInterval   = time.Minute
	NodeCleanSinceAnnotation = "berth.io/node-clean-since"
)

// UnfenceOptions tune an Unfencer.
type UnfenceOptions struct {
	// Cooldown is how long a node must stay back and cleaned before its
	// clients leave the blocklist (default DefaultUnfenceCooldown): a node
	// that flaps does not get its clients back between two losses.
	Cooldown time.Duration
	// Interval between passes (default DefaultUnfenceInterval).
	Interval time.Duration
	// Retry tunes the optimistic-concurrency retries.
	Retry Options
}

// Unfencer takes a node's blocklisted Ceph clients (NodeCleanup
// spec.blocklisted) off Ceph's blocklist once the node is back and cleaned:
// its Node object exists, is Ready and has no out-of-service taint, and its
// agent has worked off every stale entry in a pass after the blocklisting.
// It marks when it first saw that (annotation NodeCleanSinceAnnotation),
// lifts the mark when it stops being true, and unfences a Cooldown after
// the mark. It runs in the operator, whose Ceph client may remove blocklist
// entries (`profile rbd` may only add them).
type Unfencer struct {
	c    client.Client
	bl   Blocklister
	rec  record.EventRecorder
	clk  clock.Clock
	log  logr.Logger
	opts UnfenceOptions
}

// NewUnfencer returns an Unfencer; rec gets an Event on the NodeCleanup for
// every node unfenced or failed to unfence.
func NewUnfencer(c client.Client, bl Blocklister, rec record.EventRecorder, clk clock.Clock, log logr.Logger, opts UnfenceOptions) *Unfencer {
	if opts.Cooldown <= 0 {
		opts.Cooldown = DefaultUnfenceCooldown
	}
	if opts.Interval <= 0 {
		opts.Interval = DefaultUnfenceInterval
	}
	opts.Retry = opts.Retry.withDefaults()
	return &Unfencer{c: c, bl: bl, rec: rec, clk: clk, log: log, opts: opts}
}

// Start runs a pass at once and then every interval until ctx ends
// (controller-runtime manager.Runnable).
func (u *Unfencer) Start(ctx context.Context) error {
	return every(ctx, u.clk, u.opts.Interval, func() {
		if n, err := u.RunOnce(ctx); err != nil {
			u.log.Error(err, "unfence pass failed")
		} else if n > 0 {
			u.log.Info("unfence pass", "unfenced", n)
		}
	})
}

// NeedLeaderElection is true: one operator replica unfences.
func (u *Unfencer) NeedLeaderElection() bool { return true }

// RunOnce looks at every node with blocklisted clients once and returns
// how many addresses it took off the blocklist.
func (u *Unfencer) RunOnce(ctx context.Context) (int, error) {
	var list v1.NodeCleanupList
	if err := u.c.List(ctx, &list); err != nil {
		return 0, fmt.Errorf("list nodecleanups: %w", err)
	}
	total, failed := 0, 0
	var first error
	for i := range list.Items {
		nc := &list.Items[i]
		if len(nc.Spec.Blocklisted) == 0 {
			continue
		}
		n, err := u.node(ctx, nc)
		total += n
		if err != nil {
			// The other nodes' turn comes all the same.
			if failed++; first == nil {
				first = err
			}
		}
	}
	if first != nil {
		return total, fmt.Errorf("unfence: %d node(s) failed, the first: %w", failed, first)
	}
	return total, nil
}

// node handles one node's list: mark, wait, or unfence.
func (u *Unfencer) node(ctx context.Context, nc *v1.NodeCleanup) (int, error) {
	ready, why, err := backAndClean(ctx, u.c, nc)
	if err != nil {
		return 0, err
	}
	since, marked := nc.Annotations[NodeCleanSinceAnnotation]
	now := u.clk.Now()
	switch {
	case !ready && marked:
		u.log.Info("node not back and clean any more: cool-down restarts", "node", nc.Name, "why", why)
		return 0, u.setMark(ctx, nc.Name, "")
	case !ready:
		u.log.V(1).Info("blocklisted clients stay", "node", nc.Name, "why", why)
		return 0, nil
	case !marked:
		return 0, u.setMark(ctx, nc.Name, now.UTC().Format(time.RFC3339))
	}
	t, err := time.Parse(time.RFC3339, since)
	if err != nil { // not ours: start over rather than act on it
		return 0, u.setMark(ctx, nc.Name, now.UTC().Format(time.RFC3339))
	}
	if now.Sub(t) < u.opts.Cooldown {
		return 0, nil
	}
	addrs := make([]string, 0, len(nc.Spec.Blocklisted))
	for _, b := range nc.Spec.Blocklisted {
		addrs = append(addrs, b.Address)
	}
	ref := &corev1.ObjectReference{Kind: "NodeCleanup", APIVersion: v1.GroupVersion.String(), Name: nc.Name, UID: nc.UID}
	if err := u.bl.UnfenceClients(ctx, addrs); err != nil {
		u.rec.Eventf(ref, corev1.EventTypeWarning, EventUnblocklistFailed, "take node %s's Ceph clients %v off the blocklist: %v", nc.Name, addrs, err)
		return 0, fmt.Errorf("unblocklist node %s's Ceph clients: %w", nc.Name, err)
	}
	if err := u.forget(ctx, nc.Name, addrs); err != nil {
		return 0, err
	}
	u.log.Info("ceph clients unblocklisted", "node", nc.Name, "addresses", addrs, "cleanSince", since)
	u.rec.Eventf(ref, corev1.EventTypeNormal, EventUnblocklisted,
		"node %s is back and cleaned since %s: its Ceph clients %v are off the blocklist", nc.Name, since, addrs)
	return len(addrs), nil
}

// setMark writes (or, with since empty, removes) the clean-since mark.
func (u *Unfencer) setMark(ctx context.Context, node, since string) error {
	return retry(ctx, u.clk, u.opts.Retry, "mark nodecleanup "+node, func() (bool, error) {
		var nc v1.NodeCleanup
		if found, err := lookup(ctx, u.c, "nodecleanup", client.ObjectKey{Name: node}, &nc); !found {
			return true, err
		}
		if since == "" {
			delete(nc.Annotations, NodeCleanSinceAnnotation)
		} else {
			if nc.Annotations == nil {
				nc.Annotations = map[string]string{}
			}
			nc.Annotations[NodeCleanSinceAnnotation] = since
		}
		if err := u.c.Update(ctx, &nc); err != nil {
			return !raced(err), fmt.Errorf("update nodecleanup %s: %w", node, err)
		}
		return true, nil
	})
}

// forget removes the unfenced addresses and the mark.
func (u *Unfencer) forget(ctx context.Context, node string, addrs []string) error {
	return retry(ctx, u.clk, u.opts.Retry, "forget blocklisted clients of "+node, func() (bool, error) {
		var nc v1.NodeCleanup
		if found, err := lookup(ctx, u.c, "nodecleanup", client.ObjectKey{Name: node}, &nc); !found {
			return true, err
		}
		kept := nc.Spec.Blocklisted[:0:0]
		for _, b := range nc.Spec.Blocklisted {
			if !slices.Contains(addrs, b.Address) {
				kept = append(kept, b)
			}
		}
		nc.Spec.Blocklisted = kept
		delete(nc.Annotations, NodeCleanSinceAnnotation)
		if err := u.c.Update(ctx, &nc); err != nil {
			return !raced(err), fmt.Errorf("update nodecleanup %s: %w", node, err)
		}
		return true, nil
	})
}
