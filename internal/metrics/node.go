package metrics

import (
	"context"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
)

// VolumeCount is how many of a node's volumes share a state and a transport.
type VolumeCount struct {
	// State is the Volume's status.state (Available, Creating, ...).
	State string
	// Transport is how the volume reaches the kernel: loop (kernel
	// mounter), fuse or nbd (userspace mounter).
	Transport string
	N         int
}

// NodeSource answers, at scrape time, what an agent knows of its node.
type NodeSource interface {
	VolumeCounts(ctx context.Context) ([]VolumeCount, error)
	// KeeperConnections is the number of FUSE connections the keeper
	// holds; an error when the keeper cannot be asked.
	KeeperConnections(ctx context.Context) (int, error)
}

// Node is a collector of the agent's node gauges, read from its source at
// each scrape (bounded by a timeout):
//
//	berth_volumes{state, transport}           this node's volumes
//	berth_keeper_up                           1 when the keeper answered
//	berth_keeper_connections                  FUSE connections the keeper holds (only when up)
type Node struct {
	src     NodeSource
	log     logr.Logger
	timeout time.Duration

	volumes, keeperUp, keeperConns *prometheus.Desc
}

// NewNode makes and registers the node collector.
func NewNode(reg prometheus.Registerer, src NodeSource, log logr.Logger) (*Node, error) {
	n := &Node{
		src: src, log: log, timeout: 5 * time.Second,
		volumes: prometheus.NewDesc(namespace+"_volumes",
			"Volumes on this node, by status.state and transport (loop: kernel mounter; fuse, nbd: userspace mounter, rbd: a userspace ceph volume staged here; a volume not staged here: the transport this agent would stage it with).",
			[]string{"state", "transport"}, nil),
		keeperUp: prometheus.NewDesc(namespace+"_keeper_up",
			"1 when the keeper answered the agent at this scrape, 0 when it did not.", nil, nil),
		keeperConns: prometheus.NewDesc(namespace+"_keeper_connections",
			"FUSE connections of userspace volumes the keeper holds.", nil, nil),
	}
	return registered(n, reg, "node", n)
}

// Describe implements prometheus.Collector.
func (n *Node) Describe(ch chan<- *prometheus.Desc) {
	ch <- n.volumes
	ch <- n.keeperUp
	ch <- n.keeperConns
}

// Collect implements prometheus.Collector. A source that fails leaves its
// gauges out of this scrape (and is logged) rather than failing the scrape.
func (n *Node) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), n.timeout)
	defer cancel()
	counts, err := n.src.VolumeCounts(ctx)
	if err != nil {
		n.log.Error(err, "volume metrics left out of this scrape")
	}
	for _, c := range counts {
		ch <- prometheus.MustNewConstMetric(n.volumes, prometheus.GaugeValue, float64(c.N), c.State, c.Transport)
	}
	conns, err := n.src.KeeperConnections(ctx)
	if err != nil {
		n.log.V(1).Info("keeper did not answer", "error", err.Error())
		ch <- prometheus.MustNewConstMetric(n.keeperUp, prometheus.GaugeValue, 0)
		return
	}
	ch <- prometheus.MustNewConstMetric(n.keeperUp, prometheus.GaugeValue, 1)
	ch <- prometheus.MustNewConstMetric(n.keeperConns, prometheus.GaugeValue, float64(conns))
}
