package metrics

import "github.com/prometheus/client_golang/prometheus"

// FlexDriver tells the state of this node's Flexvolume driver, which is
// not part of the agent's readiness (a failed install degrades only the
// Flexvolume path; the CSI node service keeps serving).
//
//	berth_flexvolume_driver_ready    1: installed and its init handshake went through; 0: not (yet)
type FlexDriver struct {
	ready prometheus.Gauge
}

// NewFlexDriver makes and registers the gauge, at 0.
func NewFlexDriver(reg prometheus.Registerer) (*FlexDriver, error) {
	d := &FlexDriver{ready: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: namespace, Subsystem: BoundaryFlexvolume, Name: "driver_ready",
		Help: "1 once this node's Flexvolume driver is installed and its init handshake reached the agent, else 0."})}
	return registered(d, reg, "flexvolume driver", d.ready)
}

// Set records whether the driver is ready.
func (d *FlexDriver) Set(ready bool) {
	if d == nil {
		return
	}
	v := 0.0
	if ready {
		v = 1
	}
	d.ready.Set(v)
}
