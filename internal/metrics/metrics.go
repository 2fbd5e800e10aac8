// Package metrics defines berth's Prometheus metrics. Each group is a struct
// of collectors made by a constructor that registers them on the Registerer
// it is given (controller-runtime's registry where a process has a manager,
// a registry of its own otherwise): no package-level collectors, nothing
// registered at init. Every recording method is safe on a nil receiver, so
// that code paths built without metrics (tests, tools) need no checks.
package metrics

import (
	"errors"
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// namespace prefixes every berth metric.
const namespace = "berth"

// durationBuckets span what berth's operations take: milliseconds for a
// fence decision up to minutes for an mkfs or a heal behind a busy lock.
var durationBuckets = []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120, 300}

// Result label values shared by several groups.
const (
	ResultOK    = "ok"
	ResultError = "error"
)

// register registers every collector, or none: a half-registered group
// would make a second attempt fail on the half already there.
func register(reg prometheus.Registerer, group string, cs ...prometheus.Collector) error {
	done := make([]prometheus.Collector, 0, len(cs))
	for _, c := range cs {
		if err := reg.Register(c); err != nil {
			for _, d := range done {
				reg.Unregister(d)
			}
			return fmt.Errorf("register %s metrics: %w", group, err)
		}
		done = append(done, c)
	}
	return nil
}

// registered registers the collectors of a metric set m and returns m: every
// New* constructor ends this way.
func registered[T any](m *T, reg prometheus.Registerer, group string, cs ...prometheus.Collector) (*T, error) {
	if err := register(reg, group, cs...); err != nil {
		return nil, err
	}
	return m, nil
}

// IsAlreadyRegistered tells whether err says the metrics exist already on
// the registerer (a second component of the same kind in one process).
func IsAlreadyRegistered(err error) bool {
	var are prometheus.AlreadyRegisteredError
	return errors.As(err, &are)
}

// newCounter, newCounterVec, newHistogram and newHistogramVec make berth's
// collectors: every name under the berth namespace, every latency on the
// same buckets.
func newCounter(subsystem, name, help string) prometheus.Counter {
	return prometheus.NewCounter(prometheus.CounterOpts{Namespace: namespace, Subsystem: subsystem, Name: name, Help: help})
}

func newCounterVec(subsystem, name, help string, labels ...string) *prometheus.CounterVec {
	return prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: namespace, Subsystem: subsystem, Name: name, Help: help}, labels)
}

func newHistogram(subsystem, name, help string) prometheus.Histogram {
	return prometheus.NewHistogram(prometheus.HistogramOpts{
		Namespace: namespace, Subsystem: subsystem, Name: name, Help: help, Buckets: durationBuckets})
}

func newHistogramVec(subsystem, name, help string, labels ...string) *prometheus.HistogramVec {
	return prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Namespace: namespace, Subsystem: subsystem, Name: name, Help: help, Buckets: durationBuckets}, labels)
}

func seconds(d time.Duration) float64 { return d.Seconds() }

func result(err error) string {
	if err != nil {
		return ResultError
	}
	return ResultOK
}
