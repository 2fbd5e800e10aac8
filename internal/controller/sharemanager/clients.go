package sharemanager

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"slices"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/berth-io/berth/api/v1alpha1"
)

// Multus' records on a holder pod, and the labels the StorageCluster
// controller gives holder pods.
const (
	annotationNetworkStatus = "k8s.v1.cni.cncf.io/network-status"
	labelInstance           = "app.kubernetes.io/instance"
	componentHolder         = "holder"
)

// workloadNodes are the nodes that hold att's volume for a workload pod
// (an entry with a pod other than the share manager's own), sorted, each
// once: the nodes its share serves.
func workloadNodes(att *v1.Attachment, volume, namespace string) []string {
	var nodes []string
	for _, e := range att.Spec.Attachments {
		if e.IsStage() || e.PodNamespace == namespace && e.Pod == Name(volume) {
			continue
		}
		nodes = append(nodes, e.Node)
	}
	slices.Sort(nodes)
	return slices.Compact(nodes)
}

// clientsFor are the share's clients: each of nodes with the addresses its
// NFS mounts come from, as the API server has them. On the host network
// that is the Node's InternalIP (a host process dialing the Service picks
// it). On a multus network the mount is made from the holder pod's
// namespace (netns mode: its pod IP, or its multus address when routes
// send the Service there) or from the holder's interface copied to the
// host (mover mode: the multus address), so the node's holder pod's
// addresses are added. A node without an address is left out: nothing
// would match it.
func (r *Reconciler) clientsFor(ctx context.Context, nodes []string, sc *v1.StorageCluster) ([]v1.ShareClient, error) {
	var holders []corev1.Pod
	if sc != nil && sc.Spec.Network.Provider == v1.NetworkProviderMultus {
		list := &corev1.PodList{}
		if err := r.Client.List(ctx, list, client.InNamespace(r.Options.Namespace),
			client.MatchingLabels{labelInstance: sc.Name, labelComponent: componentHolder}); err != nil {
			return nil, fmt.Errorf("list holder pods of %s: %w", sc.Name, err)
		}
		holders = list.Items
	}
	var out []v1.ShareClient
	for _, name := range nodes {
		node := &corev1.Node{}
		var addrs []string
		switch err := r.Client.Get(ctx, client.ObjectKey{Name: name}, node); {
		case apierrors.IsNotFound(err):
		case err != nil:
			return nil, fmt.Errorf("read Node %s: %w", name, err)
		default:
			for _, a := range node.Status.Addresses {
				if a.Type == corev1.NodeInternalIP {
					addrs = append(addrs, a.Address)
				}
			}
			addrs = append(addrs, gateways(node)...)
		}
		for i := range holders {
			if p := &holders[i]; p.Spec.NodeName == name && p.DeletionTimestamp.IsZero() {
				addrs = append(addrs, holderAddresses(p)...)
			}
		}
		if addrs = cleanAddresses(addrs); len(addrs) > 0 {
			out = append(out, v1.ShareClient{Node: name, Addresses: addrs})
		}
	}
	return out, nil
}

// gateways are the first two addresses of each of node's pod CIDRs: the
// node's own addresses on bridge and overlay CNIs (cni0 ".1", flannel.1
// ".0"), which kube-proxy masquerades the node's Service traffic to; pods
// get later ones.
func gateways(node *corev1.Node) []string {
	cidrs := node.Spec.PodCIDRs
	if len(cidrs) == 0 && node.Spec.PodCIDR != "" {
		cidrs = []string{node.Spec.PodCIDR}
	}
	var out []string
	for _, c := range cidrs {
		p, err := netip.ParsePrefix(c)
		if err != nil || p.Bits() >= p.Addr().BitLen()-1 {
			continue
		}
		first := p.Masked().Addr()
		out = append(out, first.String(), first.Next().String())
	}
	return out
}

// clientCIDRs are the valid entries of sc's spec.rwx.clientCIDRs, as
// --clients of its share managers (an invalid one would stop ganesha).
func clientCIDRs(sc *v1.StorageCluster) []string {
	if sc == nil {
		return nil
	}
	var out []string
	for _, c := range sc.Spec.RWX.ClientCIDRs {
		if p, err := netip.ParsePrefix(c); err == nil {
			out = append(out, p.Masked().String())
		} else if a, err := netip.ParseAddr(c); err == nil && a.Zone() == "" {
			out = append(out, a.Unmap().String())
		}
	}
	return out
}

// holderAddresses are a holder pod's IPs: its pod IPs and those multus
// reports for its other interfaces.
func holderAddresses(p *corev1.Pod) []string {
	var addrs []string
	for _, ip := range p.Status.PodIPs {
		addrs = append(addrs, ip.IP)
	}
	var status []struct {
		IPs []string `json:"ips"`
	}
	if raw := p.Annotations[annotationNetworkStatus]; raw != "" && json.Unmarshal([]byte(raw), &status) == nil {
		for _, s := range status {
			addrs = append(addrs, s.IPs...)
		}
	}
	return addrs
}

// cleanAddresses keeps the valid, routable IP addresses, each once and
// sorted: ganesha's list takes nothing else, and a loopback or unspecified
// address would admit what it should not.
func cleanAddresses(in []string) []string {
	var out []string
	for _, s := range in {
		a, err := netip.ParseAddr(s)
		if err != nil || a.Zone() != "" || a.IsLoopback() || a.IsUnspecified() || a.IsMulticast() || a.IsLinkLocalUnicast() {
			continue
		}
		out = append(out, a.Unmap().String())
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// setClients writes clients into sm's spec when they changed.
func (r *Reconciler) setClients(ctx context.Context, sm *v1.ShareManager, clients []v1.ShareClient) error {
	if slices.EqualFunc(sm.Spec.Clients, clients, func(a, b v1.ShareClient) bool {
		return a.Node == b.Node && slices.Equal(a.Addresses, b.Addresses)
	}) {
		return nil
	}
	orig := sm.DeepCopy()
	sm.Spec.Clients = clients
	if err := r.Client.Patch(ctx, sm, client.MergeFrom(orig)); err != nil {
		return client.IgnoreNotFound(err)
	}
	return nil
}
