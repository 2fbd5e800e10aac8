package metrics

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Heal counts the healer's work.
//
//	berth_heal_passes_total{result}             passes over the node's volumes (ok, error: the listing failed)
//	berth_heal_volumes_total{result}            volumes looked at, by what happened (serving, restarted, busy, skipped, failed)
//	berth_heal_duration_seconds{result}         time to heal one volume
//
// A heal attempted is any volume result; succeeded is restarted; failed is failed.
type Heal struct {
	passes   *prometheus.CounterVec
	volumes  *prometheus.CounterVec
	duration *prometheus.HistogramVec
}

// HealFailed is the volume result of a heal that returned an error.
const HealFailed = "failed"

// NewHeal makes and registers the healer's metrics.
func NewHeal(reg prometheus.Registerer) (*Heal, error) {
	h := &Heal{
		passes: newCounterVec("heal", "passes_total",
			"Healer passes over this node's staged volumes (error: the listing failed).", "result"),
		volumes: newCounterVec("heal", "volumes_total",
			"Volumes the healer looked at, by result: serving (nothing to do), restarted (healed), busy (retried later), skipped, failed.", "result"),
		duration: newHistogramVec("heal", "duration_seconds",
			"Time to check and heal one volume, by result.", "result"),
	}
	return registered(h, reg, "heal", h.passes, h.volumes, h.duration)
}

// Pass records one pass; err is the listing's.
func (h *Heal) Pass(err error) {
	if h == nil {
		return
	}
	h.passes.WithLabelValues(result(err)).Inc()
}

// Volume records one volume's heal.
func (h *Heal) Volume(res string, took time.Duration) {
	if h == nil {
		return
	}
	h.volumes.WithLabelValues(res).Inc()
	h.duration.WithLabelValues(res).Observe(seconds(took))
}
