package metrics

import (
	"context"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
)

// VolumeCount is how many of a node's volumes share a state and a transport.
type VolumeCount struct {
	// State is the Volume's status.state (Available, Creating, ...).
	State string
	// Transport is how the volume reaches the kernel: loop (kernel
	// mounter), fuse, nbd or ublk (userspace mounter).
	Transport string
	N         int
}

// NodeSource answers, at scrape time, what an agent knows of its node.
type NodeSource interface {
	VolumeCounts(ctx context.Context) ([]VolumeCount, error)
	// KeeperConnections is the number of FUSE connections the keeper
	// holds; an error when the keeper cannot be asked.
	KeeperConnections(ctx context.Context) (int, error)
	// BlockdevIOErrors is, per staged userspace volume, how many requests
	// its blockdev servers answered with an I/O error since it was staged.
	BlockdevIOErrors(ctx context.Context) (map[string]uint64, error)
}

// Node is a collector of the agent's node gauges, read from its source at
// each scrape (bounded by a timeout):
//
//	berth_volumes{state, transport}           this node's volumes
//	berth_keeper_up                           1 when the keeper answered
//	berth_keeper_connections                  FUSE connections the keeper holds (only when up)
//	berth_blockdev_io_errors_total            requests of this node's userspace volumes their image failed
//
// The I/O error counter has no volume label: it is the node's sum, kept
// monotonic while volumes are unstaged (their last counts stay in it).
type Node struct {
	src     NodeSource
	log     logr.Logger
	timeout time.Duration

	volumes, keeperUp, keeperConns, ioErrors *prometheus.Desc

	mu sync.Mutex
	// ioLast is each staged volume's count at the last scrape; ioGone the
	// counts of volumes unstaged since the agent started.
	ioLast map[string]uint64
	ioGone uint64
}

// NewNode makes and registers the node collector.
func NewNode(reg prometheus.Registerer, src NodeSource, log logr.Logger) (*Node, error) {
	n := &Node{
		src: src, log: log, timeout: 5 * time.Second,
		volumes: prometheus.NewDesc(namespace+"_volumes",
			"Volumes on this node, by status.state and transport (loop: kernel mounter; fuse, nbd, ublk: userspace mounter, rbd: a userspace ceph volume staged here; a volume not staged here: the transport this agent would stage it with).",
			[]string{"state", "transport"}, nil),
		keeperUp: prometheus.NewDesc(namespace+"_keeper_up",
			"1 when the keeper answered the agent at this scrape, 0 when it did not.", nil, nil),
		keeperConns: prometheus.NewDesc(namespace+"_keeper_connections",
			"FUSE connections of userspace volumes the keeper holds.", nil, nil),
		ioErrors: prometheus.NewDesc(namespace+"_blockdev_io_errors_total",
			"Requests of this node's userspace volumes that their blockdev servers answered with an error because the image failed (read, write, sync, fallocate), since the agent started; unstaged volumes' counts stay in it.", nil, nil),
		ioLast: map[string]uint64{},
	}
	return registered(n, reg, "node", n)
}

// Describe implements prometheus.Collector.
func (n *Node) Describe(ch chan<- *prometheus.Desc) {
	ch <- n.volumes
	ch <- n.keeperUp
	ch <- n.keeperConns
	ch <- n.ioErrors
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
	if total, err := n.ioErrorTotal(ctx); err != nil {
		n.log.Error(err, "blockdev I/O error count left out of this scrape")
	} else {
		ch <- prometheus.MustNewConstMetric(n.ioErrors, prometheus.CounterValue, float64(total))
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

// ioErrorTotal is the node's I/O error count: the staged volumes' counts
// and the last counts of those unstaged since. A volume's count only grows
// while it is staged (its servers carry it on), so the sum does too.
func (n *Node) ioErrorTotal(ctx context.Context) (uint64, error) {
	counts, err := n.src.BlockdevIOErrors(ctx)
	n.mu.Lock()
	defer n.mu.Unlock()
	if err != nil && counts == nil {
		return 0, err
	}
	for v, last := range n.ioLast {
		if _, ok := counts[v]; !ok && err == nil {
			n.ioGone += last
			delete(n.ioLast, v)
		}
	}
	total := n.ioGone
	for v, c := range counts {
		if c < n.ioLast[v] {
			// Staged anew between two scrapes, or a file lost: what the
			// old staging counted stays.
			n.ioGone += n.ioLast[v]
			total += n.ioLast[v]
		}
		n.ioLast[v] = c
		total += c
	}
	for v, last := range n.ioLast {
		if _, ok := counts[v]; !ok {
			total += last // unread this time (err): its last count holds
		}
	}
	return total, nil
}
