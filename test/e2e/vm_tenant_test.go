//go:build e2e

package e2e

import (
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/berth-io/berth/internal/controller/sharemanager"
)

// testVMShareRefusesOtherTenants (#34, F1): an RWX share admits only the
// nodes that hold its volume for a pod with a claim. With the StorageCluster
// admitting no extra CIDR (the e2e install admits the pod network for its
// probes; the scenario takes that away for its run), a claimant writer on
// the VM node mounts the share with the kernel client and writes; a pod
// of another namespace, with no claim, running an NFS client against the
// share's Service from the pod network, is refused; the claimant's writes
// go on meanwhile.
func testVMShareRefusesOtherTenants(t *testing.T) {
	env, _ := needCluster(t)
	vm := env.vmNode(t) // skips before a namespace is made
	s := newScenario(t, 10*time.Minute)
	server := s.env.netnsNode(t)
	s.needBerthImage()
	s.clientCIDRs("berth", nil)
	s.node = server
	s.pvc("shared", "berth", "128Mi", corev1.ReadWriteMany, false)
	vol := s.boundPV("shared").Spec.CSI.VolumeHandle

	const writer = "claimant"
	s.podWith(writer, rwxWriterScript, claimSource("shared"), false, func(p *corev1.Pod) {
		p.Spec.NodeSelector = map[string]string{hostnameLabel: vm}
		p.Spec.Containers[0].Env = []corev1.EnvVar{{Name: "ME", Value: writer}, {Name: "PEERS", Value: writer}}
	})
	s.running(writer)
	sm := s.shareRunning(vol, "")
	s.waitAcks(writer, 3)
	if out, err := s.kubectl("-n", berthNamespace, "get", "sharemanager", vol, "-o", "jsonpath={.spec.clients}"); err == nil {
		t.Logf("share %s (on %s) admits %s", vol, sm.Spec.NodeName, out)
	}

	// Another tenant: its own namespace, no claim, the pod network, on the
	// claimant's node and on the share's.
	tenant := s.ns + "-tenant"
	if _, err := s.kubectl("create", "namespace", tenant); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = s.kubectl("delete", "namespace", tenant, "--wait=false") })
	endpoint := sharemanager.Endpoint(berthNamespace, vol)
	for _, node := range []string{vm, server} {
		start := time.Now()
		out, phase := s.probeIn(tenant, node, "tenant-"+node, endpoint, "--keep", "intruder", "--timeout", "20s")
		t.Logf("tenant probe on %s: %s after %s: %s", node, phase, time.Since(start).Round(10*time.Millisecond), out)
		if phase != corev1.PodFailed {
			t.Errorf("a pod of namespace %s with no claim reached share %s from %s: %s", tenant, vol, node, phase)
		}
		if strings.Contains(out, "kept intruder") {
			t.Errorf("the tenant probe on %s wrote to the share:\n%s", node, out)
		}
	}
	at := time.Now()
	s.waitAcksAfter(writer, at, 3)
	gap, n := s.writerChecked(writer)
	t.Logf("claimant: %d fsync'd files, longest pause %s", n, gap.Round(10*time.Millisecond))
	s.deletePod(writer)
}

// clientCIDRs sets StorageCluster cluster's spec.rwx.clientCIDRs (nil:
// none) until the test ends, when the former list comes back.
func (s *scenario) clientCIDRs(cluster string, cidrs []string) {
	s.t.Helper()
	list := "null"
	if len(cidrs) > 0 {
		list = `["` + strings.Join(cidrs, `","`) + `"]`
	}
	s.rwxSetting(cluster, "clientCIDRs", list)
}

// rwxSetting sets field of StorageCluster cluster's spec.rwx to value (JSON)
// until the test ends, when the former value (none: null) comes back.
func (s *scenario) rwxSetting(cluster, field, value string) {
	s.t.Helper()
	old, err := s.kubectl("get", "storagecluster", cluster, "-o", "jsonpath={.spec.rwx."+field+"}")
	if err != nil {
		s.t.Fatal(err)
	}
	set := func(v string) error {
		_, err := s.kubectl("patch", "storagecluster", cluster, "--type=merge", "-p", `{"spec":{"rwx":{"`+field+`":`+v+`}}}`)
		return err
	}
	if err := set(value); err != nil {
		s.t.Fatalf("set spec.rwx.%s of %s: %v", field, cluster, err)
	}
	s.t.Cleanup(func() {
		restore := "null"
		if old != "" {
			restore = old // kubectl prints a list as JSON
		}
		if err := set(restore); err != nil {
			s.t.Errorf("restore spec.rwx.%s of %s: %v", field, cluster, err)
		}
	})
}
