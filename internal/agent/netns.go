package agent

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/vishvananda/netns"

	v1 "github.com/berth-io/berth/api/v1alpha1"
	"github.com/berth-io/berth/internal/network"
	"github.com/berth-io/berth/internal/volerr"
)

// HolderNamespaces opens the network namespace of a live holder whose
// record is in a folder (network.ProcNamespaces; it needs the host's PID
// namespace, which the agent has).
type HolderNamespaces interface {
	OpenHolder(dir string) (netns.NsHandle, network.Record, error)
}

// NetnsConfig is the netns mode on this node: a StorageCluster with provider
// multus in mode netns carries its storage traffic in its holder pod's
// network namespace, and the agent does its storage network work there:
// blockdev servers of ceph volumes start in it, its own Ceph connections
// are made from it, and NFS shares are mounted from it.
type NetnsConfig struct {
	// Dir holds one folder of holder records per StorageCluster ("":
	// network.NetnsDir, what the operator gives the holders).
	Dir string
	// Holders opens a holder's namespace (nil: network.ProcNamespaces on
	// /proc).
	Holders HolderNamespaces
}

// holderNS is the agent's side of the netns mode.
type holderNS struct {
	dir     string
	holders HolderNamespaces
}

func newHolderNS(c NetnsConfig) holderNS {
	h := holderNS{dir: c.Dir, holders: c.Holders}
	if h.dir == "" {
		h.dir = network.NetnsDir
	}
	if h.holders == nil {
		h.holders = network.ProcNamespaces{Proc: "/proc"}
	}
	return h
}

// folder is where sc's holders publish their records when sc runs in the
// netns mode; "" when its storage traffic rides this host's namespace (the
// host network, or a mover's copies in it).
func (h holderNS) folder(sc *v1.StorageCluster) string {
	if sc == nil {
		return ""
	}
	n := sc.Spec.Network
	if n.Provider != v1.NetworkProviderMultus || n.Selectors == nil || n.Selectors.Public == "" ||
		n.MultusMode() != v1.MultusModeNetns {
		return ""
	}
	return filepath.Join(h.dir, sc.Name)
}

// What the caller of open did not do when no holder is found.
const (
	nothingMade   = "nothing was made"
	noServerMade  = "no blockdev server was started: the volume's I/O waits until the healer can start one there"
	noConnectMade = "no connection was made"
)

// open opens the namespace of the live holder in folder, for volume; the
// caller closes it. No holder is Unavailable (the pod may come back), and
// the error ends with outcome, what the caller left undone.
func (h holderNS) open(volume, folder, outcome string) (*os.File, error) {
	ns, rec, err := h.holders.OpenHolder(folder)
	if err != nil {
		if volume == "" {
			volume = "(fencing)"
		}
		return nil, fmt.Errorf("volume %s: StorageCluster %s runs its storage network in the netns mode (its holder pod's "+
			"network namespace), and this node has no running holder pod of it: %v. Its holder DaemonSet must run a pod on "+
			"this node (multus must give it the public network) before its storage traffic can start; %s: %w",
			volume, filepath.Base(folder), err, outcome, volerr.ErrUnavailable)
	}
	return os.NewFile(uintptr(ns), fmt.Sprintf("network namespace of holder %s/%s", rec.PodNamespace, rec.PodName)), nil
}

// do runs fn on a thread inside the namespace of the live holder in folder
// ("": here, as is). Sockets fn opens, and threads it starts through C
// libraries (librados), stay in that namespace.
func (h holderNS) do(volume, folder string, fn func() error) error {
	if folder == "" {
		return fn()
	}
	f, err := h.open(volume, folder, noConnectMade)
	if err != nil {
		return err
	}
	defer func() { _ = f.Close() }()
	return network.NewInNamespace(network.ThreadSwitcher{}).Do(netns.NsHandle(f.Fd()), fn)
}

// enter is a ceph.Config's Enter for a connection of sc (volume names the
// work in errors): inside its holder's namespace in the netns mode.
func (h holderNS) enter(volume string, sc *v1.StorageCluster) func(func() error) error {
	folder := h.folder(sc)
	return func(connect func() error) error { return h.do(volume, folder, connect) }
}

// check refuses, before a stage of volume makes anything, a ceph volume of
// a cluster in the netns mode whose holder is not running on this node.
func (h holderNS) check(volume string, sc *v1.StorageCluster) error {
	folder := h.folder(sc)
	if folder == "" || sc.Spec.Backend != v1.BackendCeph {
		return nil
	}
	f, err := h.open(volume, folder, nothingMade)
	if err != nil {
		return err
	}
	return f.Close()
}
