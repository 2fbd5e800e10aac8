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
	// DataDirs is the use of each data dir this agent keeps images in.
	DataDirs(ctx context.Context) ([]DataDirUsage, error)
}

// DataDirUsage is what one data dir holds and has left.
type DataDirUsage struct {
	Dir string
	// Size and Free are its filesystem's bytes, and those it may still
	// write (statfs f_blocks and f_bavail).
	Size, Free int64
	// Promised is the sum of its volume images' sizes; Allocated the bytes
	// they take (sparse images take less until written).
	Promised, Allocated int64
}

// Node is a collector of the agent's node gauges, read from its source at
// each scrape (bounded by a timeout):
//
//	berth_volumes{state, transport}           this node's volumes
//	berth_keeper_up                           1 when the keeper answered
//	berth_keeper_connections                  FUSE connections the keeper holds (only when up)
//	berth_blockdev_io_errors_total            requests of this node's userspace volumes their image failed
//	berth_data_dir_{size,free,promised,allocated}_bytes{dir}   each data dir's filesystem and images
//
// The I/O error counter has no volume label: it is the node's sum, kept
// monotonic while volumes are unstaged (their last counts stay in it).
type Node struct {
	src     NodeSource
	log     logr.Logger
	timeout time.Duration

	volumes, keeperUp, keeperConns, ioErrors    *prometheus.Desc
	dirSize, dirFree, dirPromised, dirAllocated *prometheus.Desc

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
		dirSize: prometheus.NewDesc(namespace+"_data_dir_size_bytes",
			"Size of the filesystem of a data dir (a StorageCluster's local volume images on this node).", []string{"dir"}, nil),
		dirFree: prometheus.NewDesc(namespace+"_data_dir_free_bytes",
			"Bytes the filesystem of a data dir may still write (statfs f_bavail): when none are left, writes of its thin volumes fail.", []string{"dir"}, nil),
		dirPromised: prometheus.NewDesc(namespace+"_data_dir_promised_bytes",
			"Sum of the sizes of a data dir's volume images: what its volumes may grow to.", []string{"dir"}, nil),
		dirAllocated: prometheus.NewDesc(namespace+"_data_dir_allocated_bytes",
			"Bytes a data dir's volume images take on its filesystem (sparse images take less than their size until written).", []string{"dir"}, nil),
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
	ch <- n.dirSize
	ch <- n.dirFree
	ch <- n.dirPromised
	ch <- n.dirAllocated
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
	dirs, err := n.src.DataDirs(ctx)
	if err != nil {
		n.log.Error(err, "data dir metrics left out of this scrape")
	}
	for _, d := range dirs {
		ch <- prometheus.MustNewConstMetric(n.dirSize, prometheus.GaugeValue, float64(d.Size), d.Dir)
		ch <- prometheus.MustNewConstMetric(n.dirFree, prometheus.GaugeValue, float64(d.Free), d.Dir)
		ch <- prometheus.MustNewConstMetric(n.dirPromised, prometheus.GaugeValue, float64(d.Promised), d.Dir)
		ch <- prometheus.MustNewConstMetric(n.dirAllocated, prometheus.GaugeValue, float64(d.Allocated), d.Dir)
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
