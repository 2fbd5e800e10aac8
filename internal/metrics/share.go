package metrics

import (
	"context"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
)

// Share counts the operator's failovers of read-write-many shares.
//
//	berth_share_failovers_total{reason}        share managers replaced after a failure (PodFailed, LeaseExpired)
//	berth_share_failover_duration_seconds      from the failure seen to the new share manager running
//
// No volume label: a cluster may hold many RWX volumes; the ShareManager's
// status.failovers counts each one's.
type Share struct {
	failovers *prometheus.CounterVec
	duration  prometheus.Histogram
}

// NewShare makes and registers the share metrics, with a zero series for
// each failover reason, so that an alert on their increase sees the first.
func NewShare(reg prometheus.Registerer, reasons ...string) (*Share, error) {
	s := &Share{
		failovers: newCounterVec("share", "failovers_total",
			"Share managers replaced after a failure, by reason: PodFailed (the pod failed or exited), LeaseExpired (its Lease lapsed, fast failover).", "reason"),
		duration: newHistogram("share", "failover_duration_seconds",
			"Time from the operator seeing a share manager fail to its replacement running (ready and serving); failovers the operator restarted through are not timed."),
	}
	for _, r := range reasons {
		s.failovers.WithLabelValues(r)
	}
	return registered(s, reg, "share", s.failovers, s.duration)
}

// FailedOver records a failover begun for reason.
func (s *Share) FailedOver(reason string) {
	if s == nil {
		return
	}
	s.failovers.WithLabelValues(reason).Inc()
}

// Recovered records a share running again, took after its failover began.
func (s *Share) Recovered(took time.Duration) {
	if s == nil {
		return
	}
	s.duration.Observe(seconds(took))
}

// ShareSource answers, at scrape time, how many shares are in each state.
type ShareSource interface {
	ShareStates(ctx context.Context) (map[string]int, error)
}

// ShareStates is a collector of the operator's shares by state, read from
// its source at each scrape:
//
//	berth_shares{state}    ShareManagers by status.state
//
// Every state in states has a series, zero or not, so that an alert on
// error sees its first share.
type ShareStates struct {
	src    ShareSource
	states []string
	log    logr.Logger
	desc   *prometheus.Desc
}

// NewShareStates makes and registers the share state collector.
func NewShareStates(reg prometheus.Registerer, src ShareSource, log logr.Logger, states ...string) (*ShareStates, error) {
	s := &ShareStates{src: src, states: states, log: log,
		desc: prometheus.NewDesc(namespace+"_shares",
			"Read-write-many shares (ShareManagers) by status.state: starting, running, stopping, stopped, error, unknown.",
			[]string{"state"}, nil)}
	return registered(s, reg, "share states", s)
}

// Describe implements prometheus.Collector.
func (s *ShareStates) Describe(ch chan<- *prometheus.Desc) { ch <- s.desc }

// Collect implements prometheus.Collector; a source that fails leaves the
// series out of this scrape (and is logged).
func (s *ShareStates) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	counts, err := s.src.ShareStates(ctx)
	if err != nil {
		s.log.Error(err, "share states left out of this scrape")
		return
	}
	seen := map[string]bool{}
	for _, st := range s.states {
		seen[st] = true
		ch <- prometheus.MustNewConstMetric(s.desc, prometheus.GaugeValue, float64(counts[st]), st)
	}
	for st, n := range counts {
		if !seen[st] {
			ch <- prometheus.MustNewConstMetric(s.desc, prometheus.GaugeValue, float64(n), st)
		}
	}
}
