package metrics

import (
	"sync"

	"github.com/prometheus/client_golang/prometheus"
)

// Pools are the CSI controller's gauges of the ceph pools it publishes
// capacities for (its leader only), as of its last read of each:
//
//	berth_ceph_pool_free_bytes{storage_cluster}    what the pool can still take (max_avail, or less under a quota)
//	berth_ceph_pool_used_bytes{storage_cluster}    data stored in the pool
//
// A pool that cannot be read keeps its last values; a cluster gone, or no
// longer ceph, loses its series.
type Pools struct {
	free, used *prometheus.GaugeVec

	mu   sync.Mutex
	seen map[string]bool
}

// NewPools makes and registers the pool gauges.
func NewPools(reg prometheus.Registerer) (*Pools, error) {
	p := &Pools{
		free: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: namespace, Subsystem: "ceph", Name: "pool_free_bytes",
			Help: "Bytes of data the StorageCluster's ceph pool can still take (max_avail, less under a byte quota), as of the CSI controller leader's last read."},
			[]string{"storage_cluster"}),
		used: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: namespace, Subsystem: "ceph", Name: "pool_used_bytes",
			Help: "Bytes of data stored in the StorageCluster's ceph pool (ceph df stored), as of the CSI controller leader's last read."},
			[]string{"storage_cluster"}),
		seen: map[string]bool{},
	}
	return registered(p, reg, "pool", p.free, p.used)
}

// Set records a read of cluster's pool.
func (p *Pools) Set(cluster string, free, used int64) {
	if p == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.seen[cluster] = true
	p.free.WithLabelValues(cluster).Set(float64(free))
	p.used.WithLabelValues(cluster).Set(float64(used))
}

// Keep drops the series of every cluster not in clusters.
func (p *Pools) Keep(clusters map[string]bool) {
	if p == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for c := range p.seen {
		if !clusters[c] {
			p.free.DeleteLabelValues(c)
			p.used.DeleteLabelValues(c)
			delete(p.seen, c)
		}
	}
}
