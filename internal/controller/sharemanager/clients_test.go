package sharemanager_test

import (
	"context"
	"reflect"
	"slices"
	"testing"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/berth-io/berth/api/v1alpha1"
	"github.com/berth-io/berth/internal/testenv"
)

// node makes a Node with addresses (removed at the end of the test).
func node(t *testing.T, name string, addrs ...corev1.NodeAddress) *corev1.Node {
	t.Helper()
	return nodeWithPodCIDR(t, name, "", addrs...)
}

// nodeWithPodCIDR is node with spec.podCIDR(s) cidr.
func nodeWithPodCIDR(t *testing.T, name, cidr string, addrs ...corev1.NodeAddress) *corev1.Node {
	t.Helper()
	ctx := testCtx(t)
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}
	if cidr != "" {
		n.Spec.PodCIDR, n.Spec.PodCIDRs = cidr, []string{cidr}
	}
	if err := env.Client.Create(ctx, n); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Client.Delete(context.Background(), n) })
	n.Status.Addresses = addrs
	if err := env.Client.Status().Update(ctx, n); err != nil {
		t.Fatal(err)
	}
	return n
}

// workloadsOn records a workload pod's entry on each of nodes in the
// volume's Attachment (only those), as the CSI node services do.
func workloadsOn(t *testing.T, volume string, nodes ...string) {
	t.Helper()
	ctx := testCtx(t)
	att := &v1.Attachment{ObjectMeta: metav1.ObjectMeta{Name: volume}}
	if err := env.Client.Get(ctx, client.ObjectKeyFromObject(att), att); err != nil {
		att.Spec.AccessMode = v1.ReadWriteMany
		if err := env.Client.Create(ctx, att); err != nil {
			t.Fatal(err)
		}
	}
	att.Spec.Attachments = nil
	for _, n := range nodes {
		pod := "w-" + n
		att.Spec.Attachments = append(att.Spec.Attachments, v1.AttachmentEntry{Node: n, PodNamespace: "tenant", Pod: pod, PodUID: "uid-" + pod,
			MountDir: "/var/lib/kubelet/pods/uid-" + pod + "/volumes/" + volume})
	}
	if err := env.Client.Update(ctx, att); err != nil {
		t.Fatal(err)
	}
}

// waitClients waits until the ShareManager admits exactly want.
func waitClients(t *testing.T, volume string, want []v1.ShareClient) {
	t.Helper()
	var got []v1.ShareClient
	testenv.Eventually(t, waitLimit, "clients of "+volume, func(ctx context.Context) (bool, error) {
		sm := &v1.ShareManager{}
		if err := env.Client.Get(ctx, client.ObjectKey{Namespace: namespace, Name: volume}, sm); err != nil {
			return false, client.IgnoreNotFound(err)
		}
		got = sm.Spec.Clients
		return reflect.DeepEqual(got, want) || len(got) == 0 && len(want) == 0, nil
	})
}

func internalIP(ip string) corev1.NodeAddress {
	return corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: ip}
}

// TestShareAdmitsOnlyItsWorkloadNodes: a share's clients are the nodes
// whose workload pods hold the volume, with their Nodes' InternalIPs and
// pod CIDR gateway addresses (not their external addresses or host
// names); they follow the
// Attachment and the Nodes' addresses, and the pod is told where to read
// them. The pod has the default requests and limits.
func TestShareAdmitsOnlyItsWorkloadNodes(t *testing.T) {
	suite.Require(t)
	const vol = "pv-clients"
	newVolume(t, vol, v1.VolumeModeFilesystem, "", v1.RWXSpec{})
	node(t, "node-c1", internalIP("10.9.1.1"), corev1.NodeAddress{Type: corev1.NodeExternalIP, Address: "203.0.113.5"},
		corev1.NodeAddress{Type: corev1.NodeHostName, Address: "node-c1"})
	c2 := nodeWithPodCIDR(t, "node-c2", "10.244.2.0/24", internalIP("10.9.1.2"))
	node(t, "node-c3", internalIP("10.9.1.3"))

	workloadsOn(t, vol, "node-c1")
	waitClients(t, vol, []v1.ShareClient{{Node: "node-c1", Addresses: []string{"10.9.1.1"}}})
	pod := sharePod(t, vol, "")
	if !slices.Contains(pod.Spec.Containers[0].Args, "--share-manager="+vol) {
		t.Errorf("share-manager args %v name no ShareManager to read clients from", pod.Spec.Containers[0].Args)
	}
	// F9: requests keep it off the first evictions, limits hold ganesha.
	res := pod.Spec.Containers[0].Resources
	if res.Requests.Cpu().String() != "100m" || res.Requests.Memory().String() != "128Mi" ||
		res.Limits.Cpu().String() != "1" || res.Limits.Memory().String() != "1Gi" {
		t.Errorf("share-manager resources %+v, want the defaults", res)
	}

	workloadsOn(t, vol, "node-c1", "node-c2")
	waitClients(t, vol, []v1.ShareClient{{Node: "node-c1", Addresses: []string{"10.9.1.1"}}, {Node: "node-c2", Addresses: []string{"10.244.2.0", "10.244.2.1", "10.9.1.2"}}})

	c2.Status.Addresses = []corev1.NodeAddress{internalIP("10.9.2.2")}
	if err := env.Client.Status().Update(testCtx(t), c2); err != nil {
		t.Fatal(err)
	}
	waitClients(t, vol, []v1.ShareClient{{Node: "node-c1", Addresses: []string{"10.9.1.1"}}, {Node: "node-c2", Addresses: []string{"10.244.2.0", "10.244.2.1", "10.9.2.2"}}})

	// The share manager runs and reports whom its ganesha admits: the
	// Volume lists those nodes, which then mount (agent.waitShare).
	k := kubelet{t}
	serve(t, k, vol, pod, "node-c3")
	waitAdmitted(t, vol, nil)
	reportAdmitted(t, vol, "node-c1,node-c2")
	waitAdmitted(t, vol, []string{"node-c1", "node-c2"})

	workloadsOn(t, vol, "node-c2")
	waitClients(t, vol, []v1.ShareClient{{Node: "node-c2", Addresses: []string{"10.244.2.0", "10.244.2.1", "10.9.2.2"}}})
	reportAdmitted(t, vol, "node-c2")
	waitAdmitted(t, vol, []string{"node-c2"})
}

// reportAdmitted writes nodes on the share's Lease, as its share manager
// does with its next renewal once ganesha admits them.
func reportAdmitted(t *testing.T, volume, nodes string) {
	t.Helper()
	ctx := testCtx(t)
	lease := &coordinationv1.Lease{}
	if err := env.Client.Get(ctx, client.ObjectKey{Namespace: namespace, Name: volume}, lease); err != nil {
		t.Fatal(err)
	}
	if lease.Annotations == nil {
		lease.Annotations = map[string]string{}
	}
	lease.Annotations[v1.ShareClientsAnnotation] = nodes
	if err := env.Client.Update(ctx, lease); err != nil {
		t.Fatal(err)
	}
}

// waitAdmitted waits until the ShareManager and its Volume list nodes as
// admitted.
func waitAdmitted(t *testing.T, volume string, nodes []string) {
	t.Helper()
	testenv.Eventually(t, waitLimit, "nodes admitted by "+volume, func(ctx context.Context) (bool, error) {
		sm, vol := &v1.ShareManager{}, &v1.Volume{}
		if err := env.Client.Get(ctx, client.ObjectKey{Namespace: namespace, Name: volume}, sm); err != nil {
			return false, err
		}
		if err := env.Client.Get(ctx, client.ObjectKey{Name: volume}, vol); err != nil {
			return false, err
		}
		return slices.Equal(sm.Status.AdmittedNodes, nodes) && slices.Equal(vol.Status.ShareNodes, nodes), nil
	})
}

// TestShareAdmitsMultusHolders: on a multus network, a workload node's
// holder pod's addresses (its pod IP, and its multus address from the
// network-status annotation) are admitted with the node's InternalIP;
// another node's holder is not. The cluster's clientCIDRs are passed on.
func TestShareAdmitsMultusHolders(t *testing.T) {
	suite.Require(t)
	const vol = "pv-clients-multus"
	spec := v1.StorageClusterSpec{Network: v1.NetworkSpec{Provider: v1.NetworkProviderMultus,
		Selectors: &v1.NetworkSelectors{Public: "default/storage"}},
		RWX: v1.RWXSpec{ClientCIDRs: []string{"10.88.0.0/16", "not-a-cidr"}}}
	newVolumeIn(t, vol, v1.VolumeModeFilesystem, "", spec)
	node(t, "node-m1", internalIP("10.9.3.1"))
	ctx := testCtx(t)
	for i, n := range []string{"node-m1", "node-m2"} {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "holder-" + n, Namespace: namespace,
			Labels: map[string]string{"app.kubernetes.io/instance": "sc-" + vol, "app.kubernetes.io/component": "holder"},
			Annotations: map[string]string{"k8s.v1.cni.cncf.io/network-status": `[{"name":"cbr0","interface":"eth0","ips":["10.244.0.` +
				string(rune('5'+i)) + `"],"default":true},{"name":"default/storage","interface":"net1","ips":["192.168.50.` + string(rune('5'+i)) + `"]}]`}},
			Spec: corev1.PodSpec{NodeName: n, Containers: []corev1.Container{{Name: "holder", Image: "berth"}}}}
		if err := env.Client.Create(ctx, p); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = env.Client.Delete(context.Background(), p, client.GracePeriodSeconds(0)) })
		p.Status.PodIPs = []corev1.PodIP{{IP: "10.244.0." + string(rune('5'+i))}}
		p.Status.PodIP = p.Status.PodIPs[0].IP
		if err := env.Client.Status().Update(ctx, p); err != nil {
			t.Fatal(err)
		}
	}
	workloadsOn(t, vol, "node-m1")
	waitClients(t, vol, []v1.ShareClient{{Node: "node-m1", Addresses: []string{"10.244.0.5", "10.9.3.1", "192.168.50.5"}}})
	// The cluster's clientCIDRs, the valid ones, reach the share manager.
	if pod := sharePod(t, vol, ""); !slices.Contains(pod.Spec.Containers[0].Args, "--clients=10.88.0.0/16") {
		t.Errorf("share-manager args %v lack the cluster's clientCIDRs", pod.Spec.Containers[0].Args)
	}
}
