//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The multus scenarios run where the cluster has multus (hack/cluster/multus.sh:
// `BERTH_E2E_MULTUS=1 hack/e2e.sh`, `berth dev up --multus`): the thin
// plugin in front of the pod network, whereabouts, and the
// NetworkAttachmentDefinitions PUBLIC_NAD and CLUSTER_NAD (macvlan on each
// node's end of a bridge in the hub) of cluster.env.

// Multus' pod annotations: the networks a pod asks for, and what it got.
const (
	networksAnnotation      = "k8s.v1.cni.cncf.io/networks"
	networkStatusAnnotation = "k8s.v1.cni.cncf.io/network-status"
)

// storageInterface is the interface name multus gives a pod's first extra
// network (and the holders ask for by name).
const storageInterface = "net1"

// needMultus skips the scenario on a cluster without multus and returns
// the public definition ("namespace/name") and its network.
func (s *scenario) needMultus() (nad string, subnet *net.IPNet) {
	s.t.Helper()
	if s.env.Vars["MULTUS"] != "1" {
		s.t.Skip("the e2e cluster has no multus: BERTH_E2E_MULTUS=1 hack/e2e.sh (berth dev up --multus) adds it")
	}
	_, subnet, err := net.ParseCIDR(s.env.Vars["PUBLIC_NET"])
	if err != nil || s.env.Vars["PUBLIC_NAD"] == "" {
		s.t.Fatalf("cluster.env has MULTUS=1 but PUBLIC_NAD %q, PUBLIC_NET %q (%v)", s.env.Vars["PUBLIC_NAD"], s.env.Vars["PUBLIC_NET"], err)
	}
	s.t.Cleanup(func() {
		if s.t.Failed() {
			s.multusLogs()
		}
	})
	return s.env.Vars["PUBLIC_NAD"], subnet
}

// multusLogs logs the end of each node's multus log (multus.sh points it
// there): why a sandbox got no storage interface, or could not be deleted.
func (s *scenario) multusLogs() {
	for _, node := range s.env.Nodes() {
		path, err := s.env.NodePath(node, "logs", "multus.log")
		if err != nil {
			s.t.Log(err)
			continue
		}
		data, err := os.ReadFile(path)
		if err != nil {
			s.t.Logf("%s: %v", node, err)
			continue
		}
		lines := strings.Split(strings.TrimSpace(string(data)), "\n")
		s.t.Logf("%s: the end of %s:\n%s", node, path, strings.Join(lines[max(0, len(lines)-30):], "\n"))
	}
}

// networkStatus is one entry of multus' network-status annotation.
type networkStatus struct {
	Name      string   `json:"name"`
	Interface string   `json:"interface"`
	IPs       []string `json:"ips"`
}

// storageAddress is the address multus reports for pod p's interface
// storageInterface on network nad; it fails the test unless there is one in
// subnet.
func (s *scenario) storageAddress(p *corev1.Pod, nad string, subnet *net.IPNet) string {
	s.t.Helper()
	raw := p.Annotations[networkStatusAnnotation]
	var status []networkStatus
	if err := json.Unmarshal([]byte(raw), &status); err != nil {
		s.t.Fatalf("pod %s/%s: network-status %q: %v", p.Namespace, p.Name, raw, err)
	}
	for _, n := range status {
		if n.Name != nad || n.Interface != storageInterface {
			continue
		}
		for _, a := range n.IPs {
			if ip := net.ParseIP(a); ip != nil && subnet.Contains(ip) {
				return a
			}
		}
	}
	s.t.Fatalf("pod %s/%s on %s: no %s address in %s on %s: network-status %s", p.Namespace, p.Name, p.Spec.NodeName, storageInterface, subnet, nad, raw)
	return ""
}

// testMultusPublicNetwork: pods on two nodes that ask for the public
// network get, besides the pod network, an interface on it with an
// address from whereabouts' pool (recorded in its IPPool), and reach each
// other over it.
func testMultusPublicNetwork(t *testing.T) {
	s := newScenario(t, 4*time.Minute)
	nad, subnet := s.needMultus()
	nodes := s.env.Nodes()
	if len(nodes) < 2 {
		t.Skipf("needs two nodes, the cluster has %d", len(nodes))
	}
	names := []string{"pub-a", "pub-b"}
	for i, name := range names {
		s.node = nodes[i]
		s.podWith(name, "exec sleep 3600", corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}, false, func(p *corev1.Pod) {
			p.Annotations = map[string]string{networksAnnotation: nad}
		})
	}
	addrs := make([]string, len(names))
	for i, name := range names {
		addrs[i] = s.storageAddress(s.running(name), nad, subnet)
		out, err := s.exec(name, "ip -4 -o addr show dev "+storageInterface)
		if err != nil || !strings.Contains(out, " "+addrs[i]+"/") {
			t.Fatalf("pod %s: %s has not the address multus reports (%s): %q %v", name, storageInterface, addrs[i], out, err)
		}
	}
	if addrs[0] == addrs[1] {
		t.Fatalf("both pods got %s", addrs[0])
	}
	t.Logf("%s: %s on %s, %s on %s", nad, addrs[0], nodes[0], addrs[1], nodes[1])

	// whereabouts keeps each allocation in its pool, naming the pod.
	pools, err := s.kubectl("-n", "kube-system", "get", "ippools.whereabouts.cni.cncf.io", "-o", "json")
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range names {
		if !strings.Contains(pools, `"podref": "`+s.ns+"/"+name+`"`) {
			t.Errorf("no IPPool allocation names %s/%s:\n%s", s.ns, name, pools)
		}
	}

	// Each way, over the storage network only (its own subnet route).
	for i, name := range names {
		peer := addrs[1-i]
		out, err := s.exec(name, fmt.Sprintf("ip route get %s && ping -c 3 -W 2 %s", peer, peer))
		if err != nil {
			t.Fatalf("%s cannot reach %s over %s: %v", name, peer, nad, err)
		}
		if !strings.Contains(out, "dev "+storageInterface) {
			t.Errorf("%s reaches %s not over %s: %s", name, peer, storageInterface, out)
		}
	}
}

// testMultusStorageClusterHolders: a StorageCluster with provider multus
// that selects the public definition: the operator reads the real
// definition and says in its NetworkReady condition what it found
// (macvlan, whereabouts: cluster-wide), and its holder DaemonSet's pods
// come up on every node with the public interface, an address from the
// pool, and their record in the node's netns-mode folder.
func testMultusStorageClusterHolders(t *testing.T) {
	s := newScenario(t, 8*time.Minute)
	nad, subnet := s.needMultus()
	const name = "multus"
	s.storageCluster(name, fmt.Sprintf(`  network:
    provider: multus
    selectors:
      public: %s
`, nad))

	var reason, message string
	s.waitFor("condition NetworkReady of "+name, 2*time.Minute, func(context.Context) (bool, error) {
		out, err := s.kubectl("get", "storagecluster", name, "-o",
			`jsonpath={.status.conditions[?(@.type=="NetworkReady")].status}|{.status.conditions[?(@.type=="NetworkReady")].reason}|{.status.conditions[?(@.type=="NetworkReady")].message}`)
		if err != nil {
			return false, nil
		}
		parts := strings.SplitN(out, "|", 3)
		if len(parts) < 3 || parts[0] == "" {
			return false, nil
		}
		reason, message = parts[1], parts[2]
		return true, nil
	})
	t.Logf("NetworkReady: %s: %s", reason, message)
	if reason != "NetworkAttachmentsFound" || !strings.Contains(message, "public "+nad+": plugin macvlan, IPAM whereabouts") {
		t.Fatalf("NetworkReady is %s: %q; want NetworkAttachmentsFound naming macvlan and whereabouts of %s", reason, message, nad)
	}

	// One holder per node, each with the public interface.
	selector := "app.kubernetes.io/name=berth,app.kubernetes.io/instance=" + name + ",app.kubernetes.io/component=holder"
	nodes := s.env.Nodes()
	var holders []corev1.Pod
	s.waitFor(fmt.Sprintf("%d holder pods Ready", len(nodes)), 3*time.Minute, func(ctx context.Context) (bool, error) {
		list, err := s.cs.CoreV1().Pods(berthNamespace).List(ctx, metav1.ListOptions{LabelSelector: selector})
		if err != nil {
			return false, err
		}
		holders = list.Items
		ready := 0
		for i := range holders {
			if podReady(&holders[i]) {
				ready++
			}
		}
		return ready == len(nodes), nil
	})
	seen := map[string]string{}
	for i := range holders {
		h := &holders[i]
		addr := s.storageAddress(h, nad, subnet)
		if other, dup := seen[addr]; dup {
			t.Errorf("holders %s and %s both got %s", other, h.Name, addr)
		}
		seen[addr] = h.Name
		// The holder found its interface and published its record where
		// the netns mode looks (a per-node folder in this cluster).
		record, err := s.env.NodePath(h.Spec.NodeName, "berth-network", "netns", name, string(h.UID)+".json")
		if err != nil {
			t.Fatal(err)
		}
		s.waitFor("the record of holder "+h.Name, time.Minute, func(context.Context) (bool, error) {
			_, err := os.Stat(record)
			return err == nil, nil
		})
		data, err := os.ReadFile(record)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(data), `"interface":"`+storageInterface+`"`) {
			t.Errorf("holder %s on %s: record %s: %s", h.Name, h.Spec.NodeName, record, data)
		}
		t.Logf("holder %s on %s: %s %s, record %s", h.Name, h.Spec.NodeName, storageInterface, addr, record)
	}
}
