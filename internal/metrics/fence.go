package metrics

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Acquire results.
const (
	AcquireGranted  = "granted"
	AcquireConflict = "conflict"
	AcquireInvalid  = "invalid"
	AcquireError    = "error"
)

// Fence counts fencing decisions (agent side).
//
//	berth_fence_acquires_total{result}        granted, conflict (refused: held by another), invalid, error
//	berth_fence_acquire_duration_seconds      time to a decision, lost races included
//	berth_fence_releases_total{result}        ok, error
//	berth_fence_lock_breaks_total{reason}     holds of another node taken over (NodeGone, NodeOutOfService, PodMoved)
type Fence struct {
	acquires *prometheus.CounterVec
	duration prometheus.Histogram
	releases *prometheus.CounterVec
	breaks   *prometheus.CounterVec
}

// NewFence makes and registers the fencing metrics.
func NewFence(reg prometheus.Registerer) (*Fence, error) {
	f := &Fence{
		acquires: newCounterVec("fence", "acquires_total",
			"Fence acquire requests, by result: granted, conflict (held by a holder the access mode excludes), invalid, error.", "result"),
		duration: newHistogram("fence", "acquire_duration_seconds",
			"Time to decide a fence acquire request, lost races included."),
		releases: newCounterVec("fence", "releases_total",
			"Fence release requests, by result: ok, error.", "result"),
		breaks: newCounterVec("fence", "lock_breaks_total",
			"Holds of another node taken over and put on its stale list, by reason.", "reason"),
	}
	return registered(f, reg, "fence", f.acquires, f.duration, f.releases, f.breaks)
}

// Acquired records one acquire decision (an Acquire* result).
func (f *Fence) Acquired(res string, took time.Duration) {
	if f == nil {
		return
	}
	f.acquires.WithLabelValues(res).Inc()
	f.duration.Observe(seconds(took))
}

// Released records one release.
func (f *Fence) Released(err error) {
	if f == nil {
		return
	}
	f.releases.WithLabelValues(result(err)).Inc()
}

// Broke records one node's holds taken over.
func (f *Fence) Broke(reason string) {
	if f == nil {
		return
	}
	f.breaks.WithLabelValues(reason).Inc()
}

// GC counts the operator's attachment GC.
//
//	berth_attachment_gc_runs_total{result}              passes, ok or error
//	berth_attachment_gc_duration_seconds                time of one pass
//	berth_attachment_gc_entries_scanned_total           entries looked at
//	berth_attachment_gc_entries_moved_total             entries moved to a node's stale list
//	berth_attachment_gc_entries_dropped_total           entries removed without a stale-list record
//	berth_attachment_gc_stale_lists_pruned_total        stale lists of long-gone nodes deleted
//	berth_attachment_gc_entries_skipped_total           entries the GC could not judge and left in place
type GC struct {
	runs                                     *prometheus.CounterVec
	duration                                 prometheus.Histogram
	scanned, moved, dropped, pruned, skipped prometheus.Counter
}

// NewGC makes and registers the attachment GC's metrics.
func NewGC(reg prometheus.Registerer) (*GC, error) {
	g := &GC{
		runs: newCounterVec("attachment_gc", "runs_total",
			"Attachment GC passes, by result: ok, error.", "result"),
		duration: newHistogram("attachment_gc", "duration_seconds",
			"Time of one attachment GC pass."),
		scanned: newCounter("attachment_gc", "entries_scanned_total", "Attachment entries the GC looked at."),
		moved:   newCounter("attachment_gc", "entries_moved_total", "Attachment entries the GC moved to a node's stale list."),
		dropped: newCounter("attachment_gc", "entries_dropped_total", "Attachment entries the GC removed without a stale-list record."),
		pruned:  newCounter("attachment_gc", "stale_lists_pruned_total", "Stale lists the GC deleted because their node was gone longer than the TTL."),
		skipped: newCounter("attachment_gc", "entries_skipped_total",
			"Attachment entries the GC could not judge (invalid pod fields, a failed lookup) and left in place for a later pass."),
	}
	return registered(g, reg, "attachment GC", g.runs, g.duration, g.scanned, g.moved, g.dropped, g.pruned, g.skipped)
}

// Run records one pass.
func (g *GC) Run(err error, took time.Duration) {
	if g == nil {
		return
	}
	g.runs.WithLabelValues(result(err)).Inc()
	g.duration.Observe(seconds(took))
}

// Entries records what a sweep of one Attachment did.
func (g *GC) Entries(scanned, moved, dropped, skipped int) {
	if g == nil {
		return
	}
	g.scanned.Add(float64(scanned))
	g.moved.Add(float64(moved))
	g.dropped.Add(float64(dropped))
	g.skipped.Add(float64(skipped))
}

// Pruned records stale lists deleted.
func (g *GC) Pruned(n int) {
	if g == nil {
		return
	}
	g.pruned.Add(float64(n))
}

// Stale-entry results of the cleaner.
const (
	StaleUndone  = "undone"
	StaleDropped = "dropped"
	StaleFailed  = "failed"
	StaleRefused = "refused"
)

// Cleanup counts the agent's work on its node's stale list.
//
//	berth_stale_passes_total{result}     passes over the list, ok or error
//	berth_stale_entries_total{result}    entries processed: undone, dropped (held again), failed (kept), refused
type Cleanup struct {
	passes  *prometheus.CounterVec
	entries *prometheus.CounterVec
}

// NewCleanup makes and registers the stale-list cleaner's metrics.
func NewCleanup(reg prometheus.Registerer) (*Cleanup, error) {
	c := &Cleanup{
		passes: newCounterVec("stale", "passes_total",
			"Passes over this node's stale-attachment list, by result: ok, error.", "result"),
		entries: newCounterVec("stale", "entries_total",
			"Stale-attachment entries processed, by result: undone, dropped (held again), failed (kept for the next pass), refused.", "result"),
	}
	return registered(c, reg, "stale-list", c.passes, c.entries)
}

// Pass records one pass and its entries.
func (c *Cleanup) Pass(err error, undone, dropped, failed, refused int) {
	if c == nil {
		return
	}
	c.passes.WithLabelValues(result(err)).Inc()
	for res, n := range map[string]int{StaleUndone: undone, StaleDropped: dropped, StaleFailed: failed, StaleRefused: refused} {
		c.entries.WithLabelValues(res).Add(float64(n))
	}
}
