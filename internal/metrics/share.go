package metrics

import (
	"time"

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
