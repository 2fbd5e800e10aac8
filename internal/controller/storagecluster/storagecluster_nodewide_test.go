package storagecluster_test

import (
	"context"
	"maps"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/berth-io/berth/api/v1alpha1"
	"github.com/berth-io/berth/internal/controller/storagecluster"
)

func agentArgs(ctx context.Context) ([]string, error) {
	agent := &appsv1.DaemonSet{}
	if err := env.Client.Get(ctx, client.ObjectKey{Namespace: namespace, Name: "berth-agent"}, agent); err != nil {
		return nil, client.IgnoreNotFound(err)
	}
	return agent.Spec.Template.Spec.Containers[0].Args, nil
}

func list(kv ...string) corev1.ResourceList {
	l := corev1.ResourceList{}
	for i := 0; i < len(kv); i += 2 {
		l[corev1.ResourceName(kv[i])] = resource.MustParse(kv[i+1])
	}
	return l
}

func setAgentResources(t *testing.T, cluster string, r *v1.AgentResources) {
	t.Helper()
	sc := &v1.StorageCluster{}
	if err := env.Client.Get(testCtx(t), client.ObjectKey{Name: cluster}, sc); err != nil {
		t.Fatal(err)
	}
	// A patch, not an update: the operator writes the object meanwhile
	// (finalizer, status), which would make an update conflict.
	orig := sc.DeepCopy()
	sc.Spec.Agent.Resources = r
	if err := env.Client.Patch(testCtx(t), sc, client.MergeFrom(orig)); err != nil {
		t.Fatal(err)
	}
}

func waitAgentResources(t *testing.T, want string) {
	t.Helper()
	eventually(t, "agent resources "+want, func(ctx context.Context) (bool, error) {
		agent := &appsv1.DaemonSet{}
		err := env.Client.Get(ctx, client.ObjectKey{Namespace: namespace, Name: "berth-agent"}, agent)
		return err == nil && resourceSummary(agent.Spec.Template.Spec.Containers[0].Resources) == want, client.IgnoreNotFound(err)
	})
}

// TestAgentResourcesRefused: the CRD takes only CPU and memory, and no
// negative amount.
func TestAgentResourcesRefused(t *testing.T) {
	suite.Require(t)
	typed := func(res v1.AgentResources) client.Object {
		return &v1.StorageCluster{ObjectMeta: metav1.ObjectMeta{Name: "refused"},
			Spec: v1.StorageClusterSpec{DataDir: "/srv/refused", Agent: v1.AgentSpec{Resources: &res}}}
	}
	// A bare YAML number reaches the API server as an integer, not a string.
	bareInt := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": v1.GroupVersion.String(), "kind": "StorageCluster",
		"metadata": map[string]any{"name": "refused"},
		"spec": map[string]any{"dataDir": "/srv/refused",
			"agent": map[string]any{"resources": map[string]any{"limits": map[string]any{"cpu": int64(-1)}}}},
	}}
	for _, tc := range []struct {
		name string
		obj  client.Object
		want string
	}{
		{"gpu request", typed(v1.AgentResources{Requests: list("nvidia.com/gpu", "1")}), "only cpu and memory"},
		{"hugepages limit", typed(v1.AgentResources{Limits: list("hugepages-2Mi", "1Gi")}), "only cpu and memory"},
		{"cpu request -100m", typed(v1.AgentResources{Requests: list("cpu", "-100m")}), "cpu must not be negative"},
		{"memory limit -1Gi", typed(v1.AgentResources{Limits: list("memory", "-1Gi")}), "memory must not be negative"},
		{"cpu limit -1 (an integer)", bareInt, "cpu must not be negative"},
	} {
		wantRefused(t, tc.name, tc.obj, tc.want)
	}
}

// wantRefused creates obj and wants the API server to refuse it as
// Invalid, saying want.
func wantRefused(t *testing.T, name string, obj client.Object, want string) {
	t.Helper()
	err := env.Client.Create(testCtx(t), obj)
	if err == nil {
		_ = env.Client.Delete(testCtx(t), obj)
	}
	if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), want) {
		t.Errorf("%s: %v, want Invalid: %s", name, err, want)
	}
}

// resourceSummary is "requests k=v ... limits k=v ...", names sorted.
func resourceSummary(r corev1.ResourceRequirements) string {
	var b strings.Builder
	for _, part := range []struct {
		name string
		list corev1.ResourceList
	}{{"requests", r.Requests}, {"limits", r.Limits}} {
		names := slices.Sorted(maps.Keys(part.list))
		b.WriteString(" " + part.name)
		for _, n := range names {
			q := part.list[n]
			b.WriteString(" " + string(n) + "=" + q.String())
		}
	}
	return strings.TrimSpace(b.String())
}

// dataDirArgs returns the agent's --data-dir values, in order.
func dataDirArgs(args []string) []string {
	var dirs []string
	for _, a := range args {
		if d, ok := strings.CutPrefix(a, "--data-dir="); ok {
			dirs = append(dirs, d)
		}
	}
	return dirs
}

// TestTwoClustersShareTheNodeWideSet: two StorageClusters get one agent
// that mounts both data dirs (sorted), placed where either wants it, and
// each its own classes naming it. Deleting one takes its data dir out of
// the agent, its classes go with it, and the keeper, CSI controller and
// CSIDriver stay the very same objects.
func TestTwoClustersShareTheNodeWideSet(t *testing.T) {
	suite.Require(t)
	oneRes := &v1.AgentResources{
		Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("500m"), corev1.ResourceMemory: resource.MustParse("256Mi")},
		Limits:   corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("1Gi")},
	}
	newCluster(t, "one", v1.StorageClusterSpec{DataDir: "/srv/one", Agent: v1.AgentSpec{NodeSelector: map[string]string{"pool": "one"}, Resources: oneRes}})
	two := newCluster(t, "two", v1.StorageClusterSpec{DataDir: "/srv/two", CleanupPolicy: v1.CleanupRetain,
		Agent: v1.AgentSpec{NodeSelector: map[string]string{"pool": "two"}}})
	eventually(t, "the agent serves both data dirs", func(ctx context.Context) (bool, error) {
		args, err := agentArgs(ctx)
		d := dataDirArgs(args)
		return slices.Contains(d, "/srv/one") && slices.Contains(d, "/srv/two") && slices.IsSorted(d), err
	})
	agent := &appsv1.DaemonSet{ObjectMeta: metav1.ObjectMeta{Name: "berth-agent", Namespace: namespace}}
	get(t, agent)
	if got := nodeTerms(agent.Spec.Template.Spec); got != "pool=one|pool=two" {
		t.Errorf("agent node terms %q, want pool=one|pool=two", got)
	}
	// one's requests are the larger; two (the defaults) has the larger
	// memory limit.
	if got := resourceSummary(agent.Spec.Template.Spec.Containers[0].Resources); got != "requests cpu=500m memory=256Mi limits memory=2Gi" {
		t.Errorf("agent resources %q, want one's requests and the default memory limit", got)
	}
	for _, cluster := range []string{"one", "two"} {
		for _, name := range []string{cluster, cluster + "-userspace"} {
			cls := &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: name}}
			get(t, cls)
			if cls.Parameters[v1.ParamStorageCluster] != cluster {
				t.Errorf("class %s parameters %v, want storageCluster=%s", name, cls.Parameters, cluster)
			}
		}
	}
	// One default class: the oldest cluster's.
	one := &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: "one"}}
	twoCls := &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: "two"}}
	get(t, one)
	get(t, twoCls)
	if one.Annotations["storageclass.kubernetes.io/is-default-class"] != "true" || twoCls.Annotations["storageclass.kubernetes.io/is-default-class"] == "true" {
		t.Errorf("default marks: one %v, two %v; want only one", one.Annotations, twoCls.Annotations)
	}

	stay := []client.Object{
		&appsv1.DaemonSet{ObjectMeta: metav1.ObjectMeta{Name: "berth-keeper", Namespace: namespace}},
		&appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Name: "berth-csi-controller", Namespace: namespace}},
		&storagev1.CSIDriver{ObjectMeta: metav1.ObjectMeta{Name: v1.DriverName}},
		&corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "berth-agent-metrics", Namespace: namespace}},
	}
	uids := map[string]string{}
	for _, o := range stay {
		get(t, o)
		uids[o.GetName()] = string(o.GetUID())
	}
	keeperGen := stay[0].GetGeneration()

	if err := env.Client.Delete(testCtx(t), two); err != nil {
		t.Fatal(err)
	}
	gone(t, two)
	eventually(t, "the agent serves one's data dir only, placed for one", func(ctx context.Context) (bool, error) {
		err := env.Client.Get(ctx, client.ObjectKeyFromObject(agent), agent)
		d := dataDirArgs(agent.Spec.Template.Spec.Containers[0].Args)
		return slices.Contains(d, "/srv/one") && !slices.Contains(d, "/srv/two") && nodeTerms(agent.Spec.Template.Spec) == "pool=one" &&
			resourceSummary(agent.Spec.Template.Spec.Containers[0].Resources) == "requests cpu=500m memory=256Mi limits memory=1Gi", err
	})
	for _, o := range stay {
		if err := env.Client.Get(testCtx(t), client.ObjectKeyFromObject(o), o); err != nil || string(o.GetUID()) != uids[o.GetName()] {
			t.Errorf("%T %s after deleting two: %v (uid %s, was %s)", o, o.GetName(), err, o.GetUID(), uids[o.GetName()])
		}
	}
	// A CPU limit one adds reaches the agent, and so does its removal,
	// which leaves the rendered container a part of the one read.
	setAgentResources(t, "one", &v1.AgentResources{Requests: oneRes.Requests, Limits: list("cpu", "1", "memory", "1Gi")})
	waitAgentResources(t, "requests cpu=500m memory=256Mi limits cpu=1 memory=1Gi")
	setAgentResources(t, "one", oneRes)
	waitAgentResources(t, "requests cpu=500m memory=256Mi limits memory=1Gi")
	// The keeper's template changed (placement); nothing of it depended
	// on two's data dir.
	if stay[0].GetGeneration() < keeperGen {
		t.Errorf("keeper generation went back")
	}
}

// TestNestedDataDirRefused: a cluster whose data dir lies inside another
// cluster's is refused (condition and Event), gets no classes, and its data
// dir is not mounted by the agent; the other cluster is unaffected.
func TestNestedDataDirRefused(t *testing.T) {
	suite.Require(t)
	outer := newCluster(t, "outer", v1.StorageClusterSpec{DataDir: "/srv/nest"})
	eventually(t, "outer is served", func(ctx context.Context) (bool, error) {
		args, err := agentArgs(ctx)
		return slices.Contains(dataDirArgs(args), "/srv/nest"), err
	})
	inner := newCluster(t, "inner", v1.StorageClusterSpec{DataDir: "/srv/nest/inner"})
	waitCondition(t, inner, storagecluster.ConditionDataDirServed, metav1.ConditionFalse, storagecluster.ReasonDataDirOverlap)
	ready := meta.FindStatusCondition(inner.Status.Conditions, v1.ConditionReady)
	if ready == nil || ready.Status != metav1.ConditionFalse || !strings.Contains(ready.Message, "/srv/nest") || !strings.Contains(ready.Message, "outer") {
		t.Errorf("inner Ready %+v, want False naming outer's /srv/nest", ready)
	}
	eventually(t, "a DataDirOverlap Event", func(ctx context.Context) (bool, error) {
		var evs corev1.EventList
		err := env.Client.List(ctx, &evs, client.MatchingFields{"involvedObject.name": "inner", "reason": storagecluster.ReasonDataDirOverlap})
		return len(evs.Items) > 0, err
	})
	args, err := agentArgs(testCtx(t))
	if err != nil || slices.Contains(dataDirArgs(args), "/srv/nest/inner") {
		t.Errorf("agent args %v (%v): the refused data dir is mounted", args, err)
	}
	if err := env.Client.Get(testCtx(t), client.ObjectKey{Name: "inner"}, &storagev1.StorageClass{}); !apierrors.IsNotFound(err) {
		t.Errorf("the refused cluster has a class (%v)", err)
	}
	waitCondition(t, outer, storagecluster.ConditionDataDirServed, metav1.ConditionTrue, storagecluster.ReasonReady)
}

// TestForeignStorageClassRefused: a StorageClass of the name a cluster's
// class would get, made by someone else, is not adopted: it stays as it
// was, and the cluster says why (Ready False, Event).
func TestForeignStorageClassRefused(t *testing.T) {
	suite.Require(t)
	foreign := &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: "mine"}, Provisioner: "example.com/other",
		Parameters: map[string]string{"x": "y"}}
	if err := env.Client.Create(testCtx(t), foreign); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Client.Delete(context.Background(), foreign) })
	sc := newCluster(t, "mine", v1.StorageClusterSpec{})
	waitCondition(t, sc, v1.ConditionReady, metav1.ConditionFalse, storagecluster.ReasonApplyFailed)
	if m := meta.FindStatusCondition(sc.Status.Conditions, v1.ConditionReady).Message; !strings.Contains(m, "StorageClass mine") ||
		!strings.Contains(m, "not made by this StorageCluster") {
		t.Errorf("Ready message %q does not name the foreign class", m)
	}
	eventually(t, "a ForeignObject Event", func(ctx context.Context) (bool, error) {
		var evs corev1.EventList
		err := env.Client.List(ctx, &evs, client.MatchingFields{"involvedObject.name": "mine", "reason": storagecluster.ReasonForeignObject})
		return len(evs.Items) > 0, err
	})
	get(t, &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: "mine-userspace"}}) // the other class is made
	got := &storagev1.StorageClass{}
	if err := env.Client.Get(testCtx(t), client.ObjectKeyFromObject(foreign), got); err != nil {
		t.Fatal(err)
	}
	if len(got.OwnerReferences) != 0 || got.Provisioner != "example.com/other" || got.Labels["app.kubernetes.io/managed-by"] != "" {
		t.Errorf("the foreign class was touched: %+v", got)
	}
}

// TestGoneClusterDataDirKeptWhileVolumes: the data dir of a deleted cluster
// stays mounted in the agent while Volumes of it remain (their images are
// deleted, and userspace ones served, from there), and goes with the last.
func TestGoneClusterDataDirKeptWhileVolumes(t *testing.T) {
	suite.Require(t)
	sc := newCluster(t, "leaving", v1.StorageClusterSpec{DataDir: "/srv/leaving", CleanupPolicy: v1.CleanupRetain})
	eventually(t, "leaving is served", func(ctx context.Context) (bool, error) {
		args, err := agentArgs(ctx)
		return slices.Contains(dataDirArgs(args), "/srv/leaving"), err
	})
	vol := &v1.Volume{ObjectMeta: metav1.ObjectMeta{Name: "leaving-vol"}, Spec: v1.VolumeSpec{StorageCluster: "leaving",
		Size: resource.MustParse("1Mi"), AccessMode: v1.ReadWriteOnce, VolumeMode: v1.VolumeModeFilesystem, Node: "n"}}
	if err := env.Client.Create(testCtx(t), vol); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Client.Delete(context.Background(), vol) })
	if err := env.Client.Delete(testCtx(t), sc); err != nil {
		t.Fatal(err)
	}
	gone(t, sc)
	// Another cluster's reconcile re-applies the set: the data dir stays.
	newCluster(t, "staying", v1.StorageClusterSpec{DataDir: "/srv/staying"})
	eventually(t, "staying is served", func(ctx context.Context) (bool, error) {
		args, err := agentArgs(ctx)
		return slices.Contains(dataDirArgs(args), "/srv/staying"), err
	})
	if args, err := agentArgs(testCtx(t)); err != nil || !slices.Contains(dataDirArgs(args), "/srv/leaving") {
		t.Errorf("agent args %v (%v): the gone cluster's data dir went while its Volume remains", args, err)
	}
	if err := env.Client.Delete(testCtx(t), vol); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the data dir goes with the last Volume", func(ctx context.Context) (bool, error) {
		args, err := agentArgs(ctx)
		return err == nil && !slices.Contains(dataDirArgs(args), "/srv/leaving"), err
	})
}

// TestAdoptsPerClusterObjects: a node-wide object that a cluster owned (as
// before the set was node-wide) loses that owner reference, so that
// deleting the cluster keeps it.
func TestAdoptsPerClusterObjects(t *testing.T) {
	suite.Require(t)
	sc := newCluster(t, "berth", v1.StorageClusterSpec{})
	keeper := &appsv1.DaemonSet{ObjectMeta: metav1.ObjectMeta{Name: "berth-keeper", Namespace: namespace}}
	get(t, keeper)
	waitCondition(t, sc, storagecluster.ConditionDataDirServed, metav1.ConditionTrue, storagecluster.ReasonReady)
	keeper.OwnerReferences = []metav1.OwnerReference{{APIVersion: v1.GroupVersion.String(), Kind: "StorageCluster", Name: sc.Name, UID: sc.UID,
		Controller: ptrTrue(), BlockOwnerDeletion: ptrTrue()}}
	if err := env.Client.Update(testCtx(t), keeper); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the owner reference is dropped", func(ctx context.Context) (bool, error) {
		err := env.Client.Get(ctx, client.ObjectKeyFromObject(keeper), keeper)
		return err == nil && len(keeper.OwnerReferences) == 0, err
	})
	// The classes of the cluster named berth keep their names.
	for _, name := range []string{"berth", "berth-userspace"} {
		cls := &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: name}}
		get(t, cls)
		checkControlledBy(t, cls, sc)
	}
}

func ptrTrue() *bool { b := true; return &b }

// controllerResources is "container: resourceSummary" for each container of
// the CSI controller Deployment, or "" when it is not there yet.
func controllerResources(ctx context.Context) (map[string]string, error) {
	dep := &appsv1.Deployment{}
	if err := env.Client.Get(ctx, client.ObjectKey{Namespace: namespace, Name: "berth-csi-controller"}, dep); err != nil {
		return nil, client.IgnoreNotFound(err)
	}
	out := map[string]string{}
	for _, c := range dep.Spec.Template.Spec.Containers {
		out[c.Name] = resourceSummary(c.Resources)
	}
	return out, nil
}

// TestCSIControllerResources: spec.csiController.resources reaches berth's
// CSI controller container, and the sidecars keep the defaults; a limit
// taken out leaves the container, and unset brings the defaults back.
func TestCSIControllerResources(t *testing.T) {
	suite.Require(t)
	const defaults = "requests cpu=10m memory=32Mi limits cpu=500m memory=256Mi"
	wait := func(what, berth string) {
		t.Helper()
		eventually(t, what, func(ctx context.Context) (bool, error) {
			got, err := controllerResources(ctx)
			if err != nil || got["csi-controller"] != berth {
				return false, err
			}
			for _, side := range []string{"csi-provisioner", "csi-resizer", "csi-snapshotter"} {
				if got[side] != defaults {
					t.Fatalf("sidecar %s resources %q, want the defaults %q", side, got[side], defaults)
				}
			}
			return true, nil
		})
	}
	// Above the defaults, so that any other cluster (asking the defaults)
	// changes nothing: the largest request and memory limit, and no CPU
	// limit as this cluster sets none.
	sc := newCluster(t, "controller-res", v1.StorageClusterSpec{DataDir: "/srv/controller-res",
		CSIController: v1.CSIControllerSpec{Resources: &corev1.ResourceRequirements{
			Requests: list("cpu", "100m", "memory", "64Mi"), Limits: list("cpu", "2", "memory", "1Gi")}}})
	wait("berth's container has the cluster's resources", "requests cpu=100m memory=64Mi limits cpu=2 memory=1Gi")
	updateCluster(t, sc, func(s *v1.StorageClusterSpec) { delete(s.CSIController.Resources.Limits, corev1.ResourceCPU) })
	wait("the CPU limit taken out", "requests cpu=100m memory=64Mi limits memory=1Gi")
	updateCluster(t, sc, func(s *v1.StorageClusterSpec) { s.CSIController.Resources = nil })
	wait("unset: the defaults", defaults)
}

// TestCSIControllerResourcesRefused: the CRD takes only CPU and memory,
// no negative amount, and no claims.
func TestCSIControllerResourcesRefused(t *testing.T) {
	suite.Require(t)
	typed := func(res corev1.ResourceRequirements) client.Object {
		return &v1.StorageCluster{ObjectMeta: metav1.ObjectMeta{Name: "refused"},
			Spec: v1.StorageClusterSpec{DataDir: "/srv/refused", CSIController: v1.CSIControllerSpec{Resources: &res}}}
	}
	for _, tc := range []struct {
		name string
		obj  client.Object
		want string
	}{
		{"gpu request", typed(corev1.ResourceRequirements{Requests: list("nvidia.com/gpu", "1")}), "only cpu and memory"},
		{"ephemeral-storage limit", typed(corev1.ResourceRequirements{Limits: list("ephemeral-storage", "1Gi")}), "only cpu and memory"},
		{"cpu request -100m", typed(corev1.ResourceRequirements{Requests: list("cpu", "-100m")}), "requests must not be negative"},
		{"memory limit -1Gi", typed(corev1.ResourceRequirements{Limits: list("memory", "-1Gi")}), "limits must not be negative"},
		{"a claim", typed(corev1.ResourceRequirements{Claims: []corev1.ResourceClaim{{Name: "gpu"}}}), "claims are not supported"},
	} {
		wantRefused(t, tc.name, tc.obj, tc.want)
	}
}
