package metrics

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// CodeOK is the code label of a successful request.
const CodeOK = "OK"

// Ops counts the requests a boundary serves (the CSI gRPC services, the
// agent socket): per operation and answer code, and their latency.
//
//	berth_<boundary>_requests_total{operation, code}
//	berth_<boundary>_request_duration_seconds{operation}
//
// Errors are the requests whose code is not OK.
type Ops struct {
	requests *prometheus.CounterVec
	duration *prometheus.HistogramVec
}

// Boundaries (the metric subsystem).
const (
	BoundaryCSI        = "csi"
	BoundaryFlexvolume = "flexvolume"
)

// NewOps makes and registers the request metrics of boundary.
func NewOps(reg prometheus.Registerer, boundary string) (*Ops, error) {
	o := &Ops{
		requests: newCounterVec(boundary, "requests_total",
			"Requests served, by operation and answer code (OK, or the error code).", "operation", "code"),
		duration: newHistogramVec(boundary, "request_duration_seconds",
			"Time to answer a request, by operation.", "operation"),
	}
	return registered(o, reg, boundary, o.requests, o.duration)
}

// Observe records one answered request.
func (o *Ops) Observe(operation, code string, took time.Duration) {
	if o == nil {
		return
	}
	o.requests.WithLabelValues(operation, code).Inc()
	o.duration.WithLabelValues(operation).Observe(seconds(took))
}
