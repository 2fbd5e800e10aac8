package fence

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/berth-io/berth/api/v1alpha1"
	"github.com/berth-io/berth/internal/metrics"
	"github.com/berth-io/berth/internal/volid"
)

// Undoer undoes one stale entry on this node: unmount the pod directory or
// the staging path, detach the device if it is still attached. It must be
// idempotent: an entry may be undone again after a crash.
type Undoer interface {
	Undo(ctx context.Context, s v1.StaleAttachment) error
}

// CleanerOptions tune a Cleaner.
type CleanerOptions struct {
	// Interval between passes (default 5m).
	Interval time.Duration
	// Lock, when set, is held around each entry's check-and-undo; the agent
	// passes its per-volume lock so that a stage or publish of the same
	// volume cannot slip between "not held any more" and the unmount. It
	// gives up when ctx ends: an operation stuck on a dead device must not
	// stop the cleanup of every other volume on the node.
	Lock func(ctx context.Context, volume string) (unlock func(), err error)
	// LockWait bounds the wait for one entry's lock (default 10s); an entry
	// whose volume stays busy is kept for the next pass.
	LockWait time.Duration
	// FailedRetry is how soon a pass that left failed entries is followed
	// by another (default 10s, doubling while entries keep failing, at most
	// Interval): a node back from a loss whose keeper starts after its
	// agent gets its stale stages undone, and so its Ceph clients
	// unfenced, within seconds rather than an Interval later.
	FailedRetry time.Duration
	// Retry tunes the optimistic-concurrency retries.
	Retry Options
	// Metrics, when set, counts passes and entries processed.
	Metrics *metrics.Cleanup
}

// Cleaner works through one node's stale-attachment list (the NodeCleanup
// named after the node): at start and every interval.
type Cleaner struct {
	c    client.Client
	node string
	u    Undoer
	clk  clock.Clock
	log  logr.Logger
	opts CleanerOptions
}

// NewCleaner returns the Cleaner of node.
func NewCleaner(c client.Client, node string, u Undoer, clk clock.Clock, log logr.Logger, opts CleanerOptions) *Cleaner {
	if opts.Interval <= 0 {
		opts.Interval = 5 * time.Minute
	}
	if opts.Lock == nil {
		opts.Lock = func(context.Context, string) (func(), error) { return func() {}, nil }
	}
	if opts.LockWait <= 0 {
		opts.LockWait = 10 * time.Second
	}
	if opts.FailedRetry <= 0 {
		opts.FailedRetry = 10 * time.Second
	}
	opts.Retry = opts.Retry.withDefaults()
	return &Cleaner{c: c, node: node, u: u, clk: clk, log: log, opts: opts}
}

// CleanResult counts what one pass did.
type CleanResult struct {
	// Undone entries were undone and removed.
	Undone int
	// Dropped entries were removed without undo: the Attachment holds them again.
	Dropped int
	// Failed entries stay for the next pass.
	Failed int
	// Refused entries were removed without undo: the Undoer will never
	// touch them (ErrRefused).
	Refused int
}

// Start runs a pass at once (the agent's start) and then every interval
// until ctx ends; after a pass that left failed entries (or failed), the
// next comes after FailedRetry, backing off to Interval. It fits
// controller-runtime's manager.Runnable.
func (cl *Cleaner) Start(ctx context.Context) error {
	retry := cl.opts.FailedRetry
	for {
		res, err := cl.RunOnce(ctx)
		if err != nil {
			cl.log.Error(err, "stale-attachment pass failed", "node", cl.node)
		} else if res != (CleanResult{}) {
			cl.log.Info("stale-attachment pass", "node", cl.node, "undone", res.Undone, "dropped", res.Dropped, "failed", res.Failed, "refused", res.Refused)
		}
		next := cl.opts.Interval
		if err != nil || res.Failed > 0 {
			next = min(retry, cl.opts.Interval)
			retry = min(2*retry, cl.opts.Interval)
		} else {
			retry = cl.opts.FailedRetry
		}
		select {
		case <-ctx.Done():
			return nil
		case <-cl.clk.After(next):
		}
	}
}

// every runs pass at once and then every interval until ctx ends.
func every(ctx context.Context, clk clock.Clock, interval time.Duration, pass func()) error {
	for {
		pass()
		select {
		case <-ctx.Done():
			return nil
		case <-clk.After(interval):
		}
	}
}

// NeedLeaderElection is false: every node's agent cleans its own list.
func (cl *Cleaner) NeedLeaderElection() bool { return false }

// RunOnce works through the list once. An entry whose volume's Attachment
// lists this node at the path the entry would undo applies no more (the
// node came back and holds the volume again, or the takeover that wrote the
// entry lost its race and never landed): it is dropped without undo. So is
// one written by another node (which may add entries to this list) that
// names a path this node holds, whatever pod it names (F2): a live mount is
// never undone by another node's word; a stage entry naming another path
// than the one this node holds the volume staged at is refused.
// Every other entry is undone, then removed; a failed undo stays listed.
func (cl *Cleaner) RunOnce(ctx context.Context) (CleanResult, error) {
	res, err := cl.runOnce(ctx)
	cl.opts.Metrics.Pass(err, res.Undone, res.Dropped, res.Failed, res.Refused)
	return res, err
}

func (cl *Cleaner) runOnce(ctx context.Context) (CleanResult, error) {
	var res CleanResult
	var nc v1.NodeCleanup
	if found, err := lookup(ctx, cl.c, "nodecleanup", client.ObjectKey{Name: cl.node}, &nc); !found {
		return res, err
	}
	var finished []v1.StaleAttachment
	var failures []error
	for _, s := range nc.Spec.Entries {
		dropped, err := cl.process(ctx, s)
		switch {
		case errors.Is(err, ErrRefused):
			// Retrying cannot help; the report keeps the reason.
			res.Refused++
			failures = append(failures, err)
			cl.log.Error(err, "refused stale attachment", "volume", s.Volume, "mountDir", s.MountDir)
		case err != nil:
			res.Failed++
			failures = append(failures, err)
			cl.log.Error(err, "undo stale attachment", "volume", s.Volume, "mountDir", s.MountDir)
			continue
		case dropped:
			res.Dropped++
		default:
			res.Undone++
		}
		finished = append(finished, s)
	}
	if err := cl.remove(ctx, finished); err != nil {
		return res, err
	}
	return res, cl.report(ctx, errors.Join(failures...))
}

// process undoes one entry unless it is held again; dropped tells which.
func (cl *Cleaner) process(ctx context.Context, s v1.StaleAttachment) (dropped bool, err error) {
	if err := volid.Valid(s.Volume); err != nil {
		return false, fmt.Errorf("stale entry: %w: %w", err, ErrRefused)
	}
	lockCtx, cancel := context.WithTimeout(ctx, cl.opts.LockWait)
	unlock, err := cl.opts.Lock(lockCtx, s.Volume)
	cancel()
	if err != nil {
		return false, fmt.Errorf("stale entry of %s at %s, kept for the next pass: %w", s.Volume, s.MountDir, err)
	}
	defer unlock()
	var att v1.Attachment
	if _, err := lookup(ctx, cl.c, "attachment", client.ObjectKey{Name: s.Volume}, &att); err != nil {
		return false, err
	}
	undo := s.UndoPath()
	// Where this node holds the volume staged, if it does.
	staged := ""
	for _, e := range att.Spec.Attachments { // none when the Attachment is gone
		if e.Node != cl.node {
			continue
		}
		if e.MountDir == undo || (e.StagingPath != "" && e.StagingPath == undo) {
			if e.MountDir != s.MountDir || e.PodUID != s.PodUID {
				cl.log.Info("stale entry names a path this node holds for the volume: dropped without undo",
					"volume", s.Volume, "path", undo, "entryPod", s.Pod, "entryPodUID", s.PodUID, "holderPodUID", e.PodUID)
			}
			return true, nil
		}
		if e.StagingPath != "" {
			staged = e.StagingPath
		}
	}
	// A node stages a volume at one path (kubelet's, named by the volume).
	// A stage entry that names another one while this node holds the
	// volume staged is made up (F2): its undo would unmount the volume's
	// device everywhere on the node, the live stage and its pods included.
	if s.IsStage() && staged != "" {
		return false, fmt.Errorf("stale stage entry of %s names %s, but this node holds the volume staged at %s: %w",
			s.Volume, undo, staged, ErrRefused)
	}
	if err := cl.u.Undo(ctx, s); err != nil {
		return false, fmt.Errorf("undo %s at %s: %w", s.Volume, s.MountDir, err)
	}
	return false, nil
}

// remove takes finished entries off the list. An entry replaced meanwhile
// (same slot, other pod or time) is new work and stays.
func (cl *Cleaner) remove(ctx context.Context, finished []v1.StaleAttachment) error {
	if len(finished) == 0 {
		return nil
	}
	return retry(ctx, cl.clk, cl.opts.Retry, "remove stale entries of node "+cl.node, func() (bool, error) {
		var nc v1.NodeCleanup
		if found, err := lookup(ctx, cl.c, "nodecleanup", client.ObjectKey{Name: cl.node}, &nc); !found {
			return true, err
		}
		kept := nc.Spec.Entries[:0:0]
		for _, s := range nc.Spec.Entries {
			if !containsStale(finished, &s) {
				kept = append(kept, s)
			}
		}
		if len(kept) == len(nc.Spec.Entries) {
			return true, nil
		}
		nc.Spec.Entries = kept
		if err := cl.c.Update(ctx, &nc); err != nil {
			return !raced(err), fmt.Errorf("update nodecleanup %s: %w", cl.node, err)
		}
		return true, nil
	})
}

func containsStale(list []v1.StaleAttachment, s *v1.StaleAttachment) bool {
	for i := range list {
		f := &list[i]
		if f.Volume == s.Volume && f.MountDir == s.MountDir && f.PodUID == s.PodUID && f.FoundAt.Equal(&s.FoundAt) {
			return true
		}
	}
	return false
}

// report writes pending, lastProcessed and the Ready condition.
func (cl *Cleaner) report(ctx context.Context, failed error) error {
	return retry(ctx, cl.clk, cl.opts.Retry, "status of nodecleanup "+cl.node, func() (bool, error) {
		var nc v1.NodeCleanup
		if found, err := lookup(ctx, cl.c, "nodecleanup", client.ObjectKey{Name: cl.node}, &nc); !found {
			return true, err
		}
		now := metav1.NewTime(cl.clk.Now())
		nc.Status.LastProcessed = &now
		nc.Status.Pending = int32(len(nc.Spec.Entries))
		cond := metav1.Condition{Type: v1.ConditionReady, Status: metav1.ConditionTrue, Reason: "Processed",
			Message: "every stale entry was undone", ObservedGeneration: nc.Generation}
		if failed != nil {
			cond.Status, cond.Reason = metav1.ConditionFalse, "UndoFailed"
			cond.Message = strings.ReplaceAll(failed.Error(), "\n", "; ")
			if len(cond.Message) > 1024 { // the API caps condition messages
				cond.Message = cond.Message[:1024]
			}
		}
		meta.SetStatusCondition(&nc.Status.Conditions, cond)
		if err := cl.c.Status().Update(ctx, &nc); err != nil {
			return !raced(err), fmt.Errorf("update status of nodecleanup %s: %w", cl.node, err)
		}
		return true, nil
	})
}
