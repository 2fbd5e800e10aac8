package storagecluster_test

import (
	"context"
	"encoding/json"
	"os"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	v1 "github.com/berth-io/berth/api/v1alpha1"
	"github.com/berth-io/berth/internal/controller/storagecluster"
)

// installNADCRD installs multus' NetworkAttachmentDefinition CRD until the
// test ends.
func installNADCRD(t *testing.T) {
	t.Helper()
	data, err := os.ReadFile("testdata/network-attachment-definition-crd.yaml")
	if err != nil {
		t.Fatal(err)
	}
	crd := &unstructured.Unstructured{}
	if err := yaml.Unmarshal(data, &crd.Object); err != nil {
		t.Fatal(err)
	}
	// The last test's CRD may still be going away.
	eventually(t, "the NetworkAttachmentDefinition CRD installs", func(ctx context.Context) (bool, error) {
		err := env.Client.Create(ctx, crd.DeepCopy())
		return err == nil, client.IgnoreAlreadyExists(err)
	})
	t.Cleanup(func() { _ = env.Client.Delete(context.Background(), crd) })
	// An installed CRD is served a moment later: until then a create of the
	// kind finds no match.
	eventually(t, "the NetworkAttachmentDefinition API is served", func(ctx context.Context) (bool, error) {
		list := &unstructured.UnstructuredList{}
		list.SetAPIVersion("k8s.cni.cncf.io/v1")
		list.SetKind("NetworkAttachmentDefinitionList")
		err := env.Client.List(ctx, list)
		return err == nil, err
	})
}

// putNAD creates or replaces the NetworkAttachmentDefinition ns/name with
// config (a CNI config JSON; "" for none).
func putNAD(t *testing.T, ns, name, config string) {
	t.Helper()
	if err := env.Client.Create(testCtx(t), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	nad := &unstructured.Unstructured{}
	nad.SetAPIVersion("k8s.cni.cncf.io/v1")
	nad.SetKind("NetworkAttachmentDefinition")
	nad.SetNamespace(ns)
	nad.SetName(name)
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		err := env.Client.Get(testCtx(t), client.ObjectKeyFromObject(nad), nad)
		if err := unstructured.SetNestedField(nad.Object, config, "spec", "config"); err != nil {
			return err
		}
		if apierrors.IsNotFound(err) {
			return env.Client.Create(testCtx(t), nad)
		}
		if err != nil {
			return err
		}
		return env.Client.Update(testCtx(t), nad)
	})
	if err != nil {
		t.Fatalf("NetworkAttachmentDefinition %s/%s: %v", ns, name, err)
	}
}

func macvlan(ipam string) string {
	if ipam == "" {
		return `{"cniVersion":"0.3.1","type":"macvlan","master":"eth1"}`
	}
	return `{"cniVersion":"0.3.1","name":"public","plugins":[{"type":"macvlan","master":"eth1","ipam":{"type":"` + ipam + `","range":"192.168.20.0/24"}},{"type":"tuning"}]}`
}

// waitNetwork waits for NetworkReady's status and reason, wants the
// message to hold each of msgs and an Event of that reason.
func waitNetwork(t *testing.T, sc *v1.StorageCluster, status metav1.ConditionStatus, reason string, msgs ...string) {
	t.Helper()
	waitCondition(t, sc, storagecluster.ConditionNetworkReady, status, reason)
	c := meta.FindStatusCondition(sc.Status.Conditions, storagecluster.ConditionNetworkReady)
	for _, m := range msgs {
		if !strings.Contains(c.Message, m) {
			t.Errorf("NetworkReady message %q does not say %q", c.Message, m)
		}
	}
	if status == metav1.ConditionFalse {
		waitCondition(t, sc, v1.ConditionReady, metav1.ConditionFalse, reason)
	}
	if reason == storagecluster.ReasonHostNetwork {
		return
	}
	eventually(t, "a "+reason+" Event", func(ctx context.Context) (bool, error) {
		var evs corev1.EventList
		err := env.Client.List(ctx, &evs, client.MatchingFields{"involvedObject.name": sc.Name, "reason": reason})
		return len(evs.Items) > 0, err
	})
}

func daemonSet(name string) *appsv1.DaemonSet {
	return &appsv1.DaemonSet{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace}}
}

func updateCluster(t *testing.T, sc *v1.StorageCluster, change func(*v1.StorageClusterSpec)) {
	t.Helper()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		if err := env.Client.Get(testCtx(t), client.ObjectKeyFromObject(sc), sc); err != nil {
			return err
		}
		change(&sc.Spec)
		return env.Client.Update(testCtx(t), sc)
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestNetworkHost: a host-network cluster has no holder, no mover and says so.
func TestNetworkHost(t *testing.T) {
	suite.Require(t)
	sc := newCluster(t, "hostnet", v1.StorageClusterSpec{})
	waitNetwork(t, sc, metav1.ConditionTrue, storagecluster.ReasonHostNetwork)
	for _, ds := range []*appsv1.DaemonSet{daemonSet(storagecluster.HolderName(sc.Name)), daemonSet("berth-mover")} {
		if err := env.Client.Get(testCtx(t), client.ObjectKeyFromObject(ds), ds); !apierrors.IsNotFound(err) {
			t.Errorf("DaemonSet %s: %v, want none", ds.Name, err)
		}
	}
	if meta.FindStatusCondition(sc.Status.Conditions, storagecluster.ConditionHolderReady) != nil {
		t.Error("a host-network cluster reports HolderReady")
	}
}

// TestNetworkMultus walks one cluster through what the operator finds of
// its networks (no multus, no definition, host-local IPAM, no config, a
// broken config, a good one) and through the modes: a holder with the
// public network's annotation in the netns mode, a mover too in the mover
// mode, both gone with provider host.
func TestNetworkMultus(t *testing.T) {
	suite.Require(t)
	sc := newCluster(t, "multus", v1.StorageClusterSpec{
		Network: v1.NetworkSpec{Provider: v1.NetworkProviderMultus, Selectors: &v1.NetworkSelectors{Public: "storage-net/public"}},
		Agent: v1.AgentSpec{NodeSelector: map[string]string{"storage": "yes"},
			Tolerations: []corev1.Toleration{{Key: "dedicated", Operator: corev1.TolerationOpExists}}},
	})
	waitNetwork(t, sc, metav1.ConditionFalse, storagecluster.ReasonMultusNotInstalled, "storage-net/public")

	installNADCRD(t)
	waitNetwork(t, sc, metav1.ConditionFalse, storagecluster.ReasonNADMissing, "public storage-net/public: NetworkAttachmentDefinition not found")
	putNAD(t, "storage-net", "public", macvlan("host-local"))
	waitNetwork(t, sc, metav1.ConditionTrue, storagecluster.ReasonIPAMNotClusterWide, "plugin macvlan, IPAM host-local", "whereabouts")
	putNAD(t, "storage-net", "public", macvlan(""))
	waitNetwork(t, sc, metav1.ConditionTrue, storagecluster.ReasonNoIPAM, "no IPAM")
	putNAD(t, "storage-net", "public", "")
	waitNetwork(t, sc, metav1.ConditionTrue, storagecluster.ReasonConfigOnNodes, "no spec.config")
	putNAD(t, "storage-net", "public", "{not json")
	waitNetwork(t, sc, metav1.ConditionFalse, storagecluster.ReasonNADInvalid, "not a CNI config")
	putNAD(t, "storage-net", "public", macvlan("whereabouts"))
	waitNetwork(t, sc, metav1.ConditionTrue, storagecluster.ReasonNetworksFound, "public storage-net/public: plugin macvlan, IPAM whereabouts")

	// A cluster network of its own is checked too; the first failure decides.
	updateCluster(t, sc, func(s *v1.StorageClusterSpec) { s.Network.Selectors.Cluster = "storage-net/replication" })
	waitNetwork(t, sc, metav1.ConditionFalse, storagecluster.ReasonNADMissing, "cluster storage-net/replication: NetworkAttachmentDefinition not found")
	putNAD(t, "storage-net", "replication", macvlan("whereabouts"))
	waitNetwork(t, sc, metav1.ConditionTrue, storagecluster.ReasonNetworksFound, "public storage-net/public: plugin macvlan", "cluster storage-net/replication: plugin macvlan")

	// The netns mode (the default): a holder, no mover.
	holder := daemonSet(storagecluster.HolderName(sc.Name))
	get(t, holder)
	checkHolder(t, sc, holder, "berth.local/berth:test", "/var/lib/berth/network/netns/multus")
	waitCondition(t, sc, storagecluster.ConditionHolderReady, metav1.ConditionFalse, storagecluster.ReasonProgressing)
	mover := daemonSet("berth-mover")
	if err := env.Client.Get(testCtx(t), client.ObjectKeyFromObject(mover), mover); !apierrors.IsNotFound(err) {
		t.Errorf("mover in the netns mode: %v, want none", err)
	}
	setDaemonSetStatus(t, holder, 1, 1)
	waitCondition(t, sc, storagecluster.ConditionHolderReady, metav1.ConditionTrue, storagecluster.ReasonReady)

	// The mover mode, with the holder's image overridden.
	updateCluster(t, sc, func(s *v1.StorageClusterSpec) {
		s.Network.Multus = &v1.MultusSpec{Mode: v1.MultusModeMover, HolderImage: "registry.example/holder:v2"}
	})
	eventually(t, "the holder publishes for the mover", func(ctx context.Context) (bool, error) {
		err := env.Client.Get(ctx, client.ObjectKeyFromObject(holder), holder)
		return err == nil && slices.Contains(holder.Spec.Template.Spec.Containers[0].Args, "--dir=/var/lib/berth/network/holders"), err
	})
	checkHolder(t, sc, holder, "registry.example/holder:v2", "/var/lib/berth/network/holders")
	get(t, mover)
	checkMover(t, mover)
	waitCondition(t, sc, storagecluster.ConditionMoverReady, metav1.ConditionFalse, storagecluster.ReasonProgressing)

	// Back to the host network: holder and mover go, and their conditions.
	updateCluster(t, sc, func(s *v1.StorageClusterSpec) {
		s.Network = v1.NetworkSpec{Provider: v1.NetworkProviderHost}
	})
	gone(t, holder)
	gone(t, mover)
	waitNetwork(t, sc, metav1.ConditionTrue, storagecluster.ReasonHostNetwork)
	for _, typ := range []string{storagecluster.ConditionHolderReady, storagecluster.ConditionMoverReady} {
		if meta.FindStatusCondition(sc.Status.Conditions, typ) != nil {
			t.Errorf("%s still reported with provider host", typ)
		}
	}
}

// TestNetworkMoverFollowsClusters: the mover is node-wide; it stays while
// any cluster is in the mover mode and goes with the last one.
func TestNetworkMoverFollowsClusters(t *testing.T) {
	suite.Require(t)
	spec := func(public string) v1.StorageClusterSpec {
		return v1.StorageClusterSpec{DataDir: "/srv/" + strings.ReplaceAll(public, "/", "-"), Network: v1.NetworkSpec{
			Provider: v1.NetworkProviderMultus, Selectors: &v1.NetworkSelectors{Public: public},
			Multus: &v1.MultusSpec{Mode: v1.MultusModeMover}}}
	}
	a := newCluster(t, "mover-a", spec("net-a/public"))
	newCluster(t, "mover-b", spec("net-b/public"))
	for _, name := range []string{"mover-a", "mover-b"} {
		h := daemonSet(storagecluster.HolderName(name))
		get(t, h)
		var nets []map[string]string
		if err := json.Unmarshal([]byte(h.Spec.Template.Annotations[storagecluster.AnnotationNetworks]), &nets); err != nil || len(nets) != 1 || nets[0]["namespace"] != "net-"+name[len(name)-1:] {
			t.Errorf("holder %s networks %v (%v)", name, nets, err)
		}
	}
	mover := daemonSet("berth-mover")
	get(t, mover)
	uid := mover.UID
	removeCluster(t, a.Name)
	gone(t, daemonSet(storagecluster.HolderName(a.Name)))
	get(t, mover)
	if mover.UID != uid {
		t.Error("the mover was replaced while a mover-mode cluster remained")
	}
	removeCluster(t, "mover-b")
	gone(t, mover)
}

// checkHolder: the public network's annotation, the record folder, the
// highest priority, OnDelete, no privilege and no API access, placed as
// the cluster's agents.
func checkHolder(t *testing.T, sc *v1.StorageCluster, ds *appsv1.DaemonSet, image, dir string) {
	t.Helper()
	checkControlledBy(t, ds, sc)
	tpl := ds.Spec.Template
	p := tpl.Spec
	var nets []map[string]string
	if err := json.Unmarshal([]byte(tpl.Annotations[storagecluster.AnnotationNetworks]), &nets); err != nil ||
		len(nets) != 1 || nets[0]["namespace"] != "storage-net" || nets[0]["name"] != "public" || nets[0]["interface"] != "net1" {
		t.Errorf("holder networks annotation %q (%v)", tpl.Annotations[storagecluster.AnnotationNetworks], err)
	}
	if ds.Spec.UpdateStrategy.Type != appsv1.OnDeleteDaemonSetStrategyType {
		t.Errorf("holder update strategy %q", ds.Spec.UpdateStrategy.Type)
	}
	checkPod(t, "holder", p, "system-node-critical")
	if p.HostNetwork || p.HostPID || p.AutomountServiceAccountToken == nil || *p.AutomountServiceAccountToken {
		t.Errorf("holder host network %v host PID %v token %v", p.HostNetwork, p.HostPID, p.AutomountServiceAccountToken)
	}
	checkPlacement(t, "holder", p)
	c := p.Containers[0]
	if c.Image != image || !slices.Equal(c.Args, []string{"holder", "--dir=" + dir, "--interface=net1"}) {
		t.Errorf("holder image %s args %v", c.Image, c.Args)
	}
	sec := c.SecurityContext
	if sec == nil || (sec.Privileged != nil && *sec.Privileged) || sec.Capabilities == nil || !slices.Equal(sec.Capabilities.Drop, []corev1.Capability{"ALL"}) || len(sec.Capabilities.Add) != 0 {
		t.Errorf("holder security context %+v", sec)
	}
	if rp := c.ReadinessProbe; rp == nil || rp.Exec == nil || !slices.Equal(rp.Exec.Command, []string{"berth", "holder", "--dir=" + dir, "--ready"}) || c.LivenessProbe != nil {
		t.Errorf("holder probes: readiness %+v liveness %+v, want readiness only, berth holder --ready", c.ReadinessProbe, c.LivenessProbe)
	}
	if uid := env1(c, "POD_UID"); uid == nil || uid.ValueFrom == nil || uid.ValueFrom.FieldRef.FieldPath != "metadata.uid" {
		t.Errorf("holder POD_UID %+v", uid)
	}
	if len(p.Volumes) != 1 || p.Volumes[0].HostPath == nil || p.Volumes[0].HostPath.Path != dir || len(c.VolumeMounts) != 1 || c.VolumeMounts[0].MountPath != dir {
		t.Errorf("holder volumes %+v mounts %+v", p.Volumes, c.VolumeMounts)
	}
}

// checkMover: node-wide, privileged on the host network and PID namespace
// with NET_ADMIN and SYS_ADMIN, the holders' folder, OnDelete, the highest
// priority.
func checkMover(t *testing.T, ds *appsv1.DaemonSet) {
	t.Helper()
	checkNodeWide(t, ds)
	p := ds.Spec.Template.Spec
	if ds.Spec.UpdateStrategy.Type != appsv1.OnDeleteDaemonSetStrategyType {
		t.Errorf("mover update strategy %q", ds.Spec.UpdateStrategy.Type)
	}
	checkPod(t, "mover", p, "system-node-critical")
	if !p.HostNetwork || !p.HostPID {
		t.Errorf("mover host network %v host PID %v", p.HostNetwork, p.HostPID)
	}
	c := p.Containers[0]
	if !slices.Equal(c.Args, []string{"mover", "--dir=/var/lib/berth/network/holders", "--proc=/proc"}) {
		t.Errorf("mover args %v", c.Args)
	}
	if c.LivenessProbe != nil || c.ReadinessProbe != nil {
		t.Errorf("mover probes: liveness %+v readiness %+v, want none (a restart cuts the network)", c.LivenessProbe, c.ReadinessProbe)
	}
	sec := c.SecurityContext
	if sec == nil || sec.Privileged == nil || !*sec.Privileged || sec.Capabilities == nil ||
		!slices.Contains(sec.Capabilities.Add, "NET_ADMIN") || !slices.Contains(sec.Capabilities.Add, "SYS_ADMIN") {
		t.Errorf("mover security context %+v", sec)
	}
	if len(p.Volumes) != 1 || p.Volumes[0].HostPath == nil || p.Volumes[0].HostPath.Path != "/var/lib/berth/network/holders" {
		t.Errorf("mover volumes %+v", p.Volumes)
	}
}

// TestNetworkControllerJoinsPublicNetworks: the CSI controller pod joins
// the public network of every ceph cluster on multus (once each, sorted),
// not a local cluster's, and leaves them when those clusters go.
func TestNetworkControllerJoinsPublicNetworks(t *testing.T) {
	suite.Require(t)
	multus := func(spec v1.StorageClusterSpec, dir, public string) v1.StorageClusterSpec {
		spec.DataDir = dir
		spec.Network = v1.NetworkSpec{Provider: v1.NetworkProviderMultus, Selectors: &v1.NetworkSelectors{Public: public}}
		return spec
	}
	ceph := cephClusterSpec([]string{"192.0.2.1:3300"}, "rbd", "no-such-secret")
	newCluster(t, "ctl-ceph-b", multus(ceph, "/srv/ctl-b", "net-b/public"))
	newCluster(t, "ctl-ceph-a", multus(ceph, "/srv/ctl-a", "net-a/public"))
	newCluster(t, "ctl-ceph-a2", multus(ceph, "/srv/ctl-a2", "net-a/public"))
	newCluster(t, "ctl-local", multus(v1.StorageClusterSpec{}, "/srv/ctl-local", "net-c/public"))
	dep := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Name: storagecluster.ObjectName("csi-controller"), Namespace: namespace}}
	want := `[{"name":"public","namespace":"net-a"},{"name":"public","namespace":"net-b"}]`
	eventually(t, "the CSI controller on net-a and net-b", func(ctx context.Context) (bool, error) {
		err := env.Client.Get(ctx, client.ObjectKeyFromObject(dep), dep)
		return err == nil && dep.Spec.Template.Annotations[storagecluster.AnnotationNetworks] == want, client.IgnoreNotFound(err)
	})
	for _, name := range []string{"ctl-ceph-a", "ctl-ceph-a2", "ctl-ceph-b"} {
		removeCluster(t, name)
	}
	eventually(t, "the CSI controller on no storage network", func(ctx context.Context) (bool, error) {
		err := env.Client.Get(ctx, client.ObjectKeyFromObject(dep), dep)
		if apierrors.IsNotFound(err) {
			return true, nil
		}
		_, on := dep.Spec.Template.Annotations[storagecluster.AnnotationNetworks]

		return err == nil && !on, err
	})
}
