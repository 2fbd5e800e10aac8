package storagecluster_test

import (
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/berth-io/berth/api/v1alpha1"
	"github.com/berth-io/berth/internal/controller/storagecluster"
)

// cephConnectTimeout bounds each step of the operator's ceph checks here,
// so that an unreachable monitor is reported within seconds.
const cephConnectTimeout = 3 * time.Second

// cephSecret makes a Secret in berth's namespace with data (nil: none).
func cephSecret(t *testing.T, name string, data map[string]string) {
	t.Helper()
	s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace}, StringData: data}
	if err := env.Client.Create(testCtx(t), s); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Client.Delete(context.Background(), s) })
}

func cephClusterSpec(monitors []string, pool, secret string) v1.StorageClusterSpec {
	spec := &v1.CephSpec{Pool: pool, SecretRef: v1.CephSecretReference{Name: secret, Namespace: namespace}}
	for _, m := range monitors {
		spec.Monitors = append(spec.Monitors, v1.CephMonitor(m))
	}
	return v1.StorageClusterSpec{Backend: v1.BackendCeph, DataDir: "/srv/berth", Ceph: spec}
}

// waitBackend waits for BackendReady's reason and returns the condition;
// Ready must then name the backend's reason too, and an Event of that
// reason must exist. None of them may show key.
func waitBackend(t *testing.T, sc *v1.StorageCluster, status metav1.ConditionStatus, reason, key string) metav1.Condition {
	t.Helper()
	waitCondition(t, sc, storagecluster.ConditionBackendReady, status, reason)
	c := *meta.FindStatusCondition(sc.Status.Conditions, storagecluster.ConditionBackendReady)
	if status == metav1.ConditionFalse {
		waitCondition(t, sc, v1.ConditionReady, metav1.ConditionFalse, reason)
		if sc.Status.Phase != v1.StorageClusterError {
			t.Errorf("phase %q, want Error", sc.Status.Phase)
		}
	}
	var evs corev1.EventList
	eventually(t, "a "+reason+" Event", func(ctx context.Context) (bool, error) {
		err := env.Client.List(ctx, &evs, client.MatchingFields{"involvedObject.name": sc.Name, "reason": reason})
		return len(evs.Items) > 0, err
	})
	if key != "" {
		for _, e := range evs.Items {
			if strings.Contains(e.Message, key) {
				t.Errorf("Event %s shows the key", e.Name)
			}
		}
		for _, c := range sc.Status.Conditions {
			if strings.Contains(c.Message, key) {
				t.Errorf("condition %s shows the key", c.Type)
			}
		}
	}
	return c
}

func TestBackendReadyLocal(t *testing.T) {
	suite.Require(t)
	sc := newCluster(t, "local-backend", v1.StorageClusterSpec{DataDir: "/srv/berth"})
	waitCondition(t, sc, storagecluster.ConditionBackendReady, metav1.ConditionTrue, storagecluster.ReasonLocalBackend)
}

// A Secret that is missing or lacks a key is named before Ceph is dialled.
func TestBackendReadySecretInvalid(t *testing.T) {
	suite.Require(t)
	sc := newCluster(t, "ceph-nosecret", cephClusterSpec([]string{"127.0.0.1:1"}, "rbd", "ceph-nosecret"))
	c := waitBackend(t, sc, metav1.ConditionFalse, storagecluster.ReasonSecretInvalid, "")
	if want := "Secret " + namespace + "/ceph-nosecret not found"; c.Message != want {
		t.Errorf("message %q, want %q", c.Message, want)
	}

	cephSecret(t, "ceph-halfsecret", map[string]string{"userID": "berth", "userKey": ""})
	sc = newCluster(t, "ceph-halfsecret", cephClusterSpec([]string{"127.0.0.1:1"}, "rbd", "ceph-halfsecret"))
	c = waitBackend(t, sc, metav1.ConditionFalse, storagecluster.ReasonSecretInvalid, "")
	if want := "Secret " + namespace + "/ceph-halfsecret lacks key userKey"; c.Message != want {
		t.Errorf("message %q, want %q", c.Message, want)
	}

	// A Secret outside berth's namespace is refused without a read: berth's
	// roles grant Secrets in its namespace only (F10).
	spec := cephClusterSpec([]string{"127.0.0.1:1"}, "rbd", "ceph-elsewhere")
	spec.Ceph.SecretRef.Namespace = "default"
	sc = newCluster(t, "ceph-elsewhere", spec)
	c = waitBackend(t, sc, metav1.ConditionFalse, storagecluster.ReasonSecretInvalid, "")
	if want := "Secret default/ceph-elsewhere: berth reads Secrets only in its own namespace, " + namespace + ": create it there"; c.Message != want {
		t.Errorf("message %q, want %q", c.Message, want)
	}
}

// A monitor host name that does not resolve is MonitorsUnreachable, named.
func TestBackendReadyMonitorDoesNotResolve(t *testing.T) {
	suite.Require(t)
	cephSecret(t, "ceph-noname", map[string]string{"userID": "berth", "userKey": "AQBfakefakefakefakefakefakefakefakefake=="})
	sc := newCluster(t, "ceph-noname", cephClusterSpec([]string{"mon.invalid:3300"}, "rbd", "ceph-noname"))
	c := waitBackend(t, sc, metav1.ConditionFalse, storagecluster.ReasonMonitorsUnreachable, "AQBfakefakefakefakefakefakefakefakefake==")
	if !strings.Contains(c.Message, "monitor host mon.invalid does not resolve") {
		t.Errorf("message %q", c.Message)
	}
}

// On a Multus public network, unreachable monitors name the likely cause:
// the operator's own pod is not on that network.
func TestBackendReadyMonitorsUnreachableNamesPublicNetwork(t *testing.T) {
	suite.Require(t)
	cephSecret(t, "ceph-multus", map[string]string{"userID": "berth", "userKey": "AQBfakefakefakefakefakefakefakefakefake=="})
	spec := cephClusterSpec([]string{"mon.invalid:3300"}, "rbd", "ceph-multus")
	spec.Network = v1.NetworkSpec{Provider: v1.NetworkProviderMultus, Selectors: &v1.NetworkSelectors{Public: "berth-system/public"}}
	sc := newCluster(t, "ceph-multus", spec)
	waitCondition(t, sc, storagecluster.ConditionBackendReady, metav1.ConditionFalse, storagecluster.ReasonMonitorsUnreachable)
	c := meta.FindStatusCondition(sc.Status.Conditions, storagecluster.ConditionBackendReady)
	for _, want := range []string{"monitor host mon.invalid does not resolve", "Multus network berth-system/public", "operator.networks=berth-system/public"} {
		if !strings.Contains(c.Message, want) {
			t.Errorf("message %q lacks %q", c.Message, want)
		}
	}
}

// A ceph cluster's classes name its Secret for NodeStageVolume: kubelet
// hands the cephx key to the agent, which has no access to Secrets. They
// bind at once: no CSIStorageCapacity is published for them, so the
// scheduler would place no pod of a claim waiting for its first consumer.
func TestCephClassesNameNodeStageSecret(t *testing.T) {
	suite.Require(t)
	cephSecret(t, "ceph-classes", map[string]string{"userID": "berth", "userKey": "AQBfakefakefakefakefakefakefakefakefake=="})
	sc := newCluster(t, "ceph-classes", cephClusterSpec([]string{"127.0.0.1:1"}, "rbd", "ceph-classes"))
	for _, m := range []v1.Mounter{v1.MounterKernel, v1.MounterUserspace} {
		cls := &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: storagecluster.StorageClassName(sc.Name, m)}}
		get(t, cls)
		if cls.Parameters["csi.storage.k8s.io/node-stage-secret-name"] != "ceph-classes" ||
			cls.Parameters["csi.storage.k8s.io/node-stage-secret-namespace"] != namespace {
			t.Errorf("class %s parameters %v: want the node-stage secret %s/ceph-classes", cls.Name, cls.Parameters, namespace)
		}
		if m := ptr.Deref(cls.VolumeBindingMode, ""); m != storagev1.VolumeBindingImmediate {
			t.Errorf("class %s binding mode %s, want Immediate", cls.Name, m)
		}
	}
}

// nodeSecretRef added to a cluster made without it: the update is
// admitted, and the operator makes the cluster's classes anew (their
// parameters cannot change) to hand the nodes the new Secret. Changing or
// removing it is still refused: the volumes made since name it.
func TestCephNodeSecretAddedLater(t *testing.T) {
	suite.Require(t)
	key := "AQBfakefakefakefakefakefakefakefakefake=="
	cephSecret(t, "ceph-later", map[string]string{"userID": "berth", "userKey": key})
	cephSecret(t, "ceph-later-node", map[string]string{"userID": "berth-node", "userKey": key})
	sc := newCluster(t, "ceph-later", cephClusterSpec([]string{"127.0.0.1:1"}, "rbd", "ceph-later"))
	classes := func() []*storagev1.StorageClass {
		var out []*storagev1.StorageClass
		for _, m := range []v1.Mounter{v1.MounterKernel, v1.MounterUserspace} {
			cls := &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: storagecluster.StorageClassName(sc.Name, m)}}
			get(t, cls)
			out = append(out, cls)
		}
		return out
	}
	before := classes()
	for _, cls := range before {
		if cls.Parameters["csi.storage.k8s.io/node-stage-secret-name"] != "ceph-later" {
			t.Fatalf("class %s parameters %v: want the cluster's secret ceph-later", cls.Name, cls.Parameters)
		}
	}

	// Patches, not Get and Update: the operator writes the cluster's status
	// meanwhile, and an Update on a stale resourceVersion would conflict.
	setNodeSecret := func(ref *v1.CephSecretReference) error {
		get(t, sc)
		orig := sc.DeepCopy()
		sc.Spec.Ceph.NodeSecretRef = ref
		return env.Client.Patch(testCtx(t), sc, client.MergeFrom(orig))
	}
	if err := setNodeSecret(&v1.CephSecretReference{Name: "ceph-later-node", Namespace: namespace}); err != nil {
		t.Fatalf("add nodeSecretRef: %v, want admitted", err)
	}
	for _, old := range before {
		eventually(t, "class "+old.Name+" made anew with the nodes' Secret", func(ctx context.Context) (bool, error) {
			cls := &storagev1.StorageClass{}
			if err := env.Client.Get(ctx, client.ObjectKeyFromObject(old), cls); err != nil {
				return false, client.IgnoreNotFound(err)
			}
			return cls.UID != old.UID && cls.Parameters["csi.storage.k8s.io/node-stage-secret-name"] == "ceph-later-node" &&
				cls.Parameters["csi.storage.k8s.io/node-stage-secret-namespace"] == namespace &&
				cls.Parameters[v1.ParamStorageCluster] == sc.Name, nil
		})
	}
	eventually(t, "StorageClassReplaced Events naming the nodes' Secret", func(ctx context.Context) (bool, error) {
		var evs corev1.EventList
		err := env.Client.List(ctx, &evs, client.MatchingFields{"involvedObject.name": sc.Name, "reason": storagecluster.EventStorageClassReplaced})
		// This cluster's (an earlier run's of the same name are there too).
		n := 0
		for _, ev := range evs.Items {
			if ev.InvolvedObject.UID == sc.UID && strings.Contains(ev.Message, namespace+"/ceph-later-node") {
				n++
			}
		}
		return n == 2, err
	})

	for what, ref := range map[string]*v1.CephSecretReference{"changed": {Name: "other", Namespace: namespace}, "removed": nil} {
		if err := setNodeSecret(ref); err == nil || !strings.Contains(err.Error(), "nodeSecretRef may be added but not changed or removed") {
			t.Errorf("nodeSecretRef %s: %v, want refused", what, err)
		}
	}
}

// With keys by role (F5), the classes hand the nodes their own Secret
// (nodeSecretRef), never the operator's; a missing node Secret makes the
// backend SecretInvalid, saying which.
func TestCephClassesNameTheNodesSecret(t *testing.T) {
	suite.Require(t)
	key := "AQBfakefakefakefakefakefakefakefakefake=="
	cephSecret(t, "ceph-roles", map[string]string{"userID": "berth", "userKey": key})
	spec := cephClusterSpec([]string{"127.0.0.1:1"}, "rbd", "ceph-roles")
	spec.Ceph.NodeSecretRef = &v1.CephSecretReference{Name: "ceph-roles-node", Namespace: namespace}
	sc := newCluster(t, "ceph-roles", spec)
	waitCondition(t, sc, storagecluster.ConditionBackendReady, metav1.ConditionFalse, storagecluster.ReasonSecretInvalid)
	if c := meta.FindStatusCondition(sc.Status.Conditions, storagecluster.ConditionBackendReady); !strings.Contains(c.Message, "nodeSecretRef") {
		t.Errorf("message %q does not name nodeSecretRef", c.Message)
	}
	for _, m := range []v1.Mounter{v1.MounterKernel, v1.MounterUserspace} {
		cls := &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: storagecluster.StorageClassName(sc.Name, m)}}
		get(t, cls)
		if cls.Parameters["csi.storage.k8s.io/node-stage-secret-name"] != "ceph-roles-node" {
			t.Errorf("class %s parameters %v: want the nodes' secret ceph-roles-node", cls.Name, cls.Parameters)
		}
	}
}
