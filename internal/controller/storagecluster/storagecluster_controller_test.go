package storagecluster_test

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	v1 "github.com/berth-io/berth/api/v1alpha1"
	"github.com/berth-io/berth/internal/controller/storagecluster"
)

// TestNodeWideObjects: the agent, keeper, CSI controller, their Services
// and the CSIDriver are one node-wide set, owned by no StorageCluster; a
// cluster's classes are its own.
func TestNodeWideObjects(t *testing.T) {
	suite.Require(t)
	sc := newCluster(t, "alpha", v1.StorageClusterSpec{
		DataDir: "/srv/berth",
		Agent: v1.AgentSpec{
			NodeSelector: map[string]string{"storage": "yes"},
			Tolerations:  []corev1.Toleration{{Key: "dedicated", Operator: corev1.TolerationOpEqual, Value: "storage", Effect: corev1.TaintEffectNoSchedule}},
		},
	})

	agent := &appsv1.DaemonSet{ObjectMeta: metav1.ObjectMeta{Name: "berth-agent", Namespace: namespace}}
	eventually(t, "the agent serves alpha's data dir", func(ctx context.Context) (bool, error) {
		err := env.Client.Get(ctx, client.ObjectKeyFromObject(agent), agent)
		return err == nil && slices.Contains(agent.Spec.Template.Spec.Containers[0].Args, "--data-dir=/srv/berth"), client.IgnoreNotFound(err)
	})
	checkNodeWide(t, agent)
	p := agent.Spec.Template.Spec
	if !p.HostNetwork || !p.HostPID || p.ServiceAccountName != "berth-agent" {
		t.Errorf("agent pod: hostNetwork=%v hostPID=%v sa=%q", p.HostNetwork, p.HostPID, p.ServiceAccountName)
	}
	checkPlacement(t, "agent", p)
	checkPod(t, "agent", p, "system-node-critical")
	c := p.Containers[0]
	if c.Image != opts.Image || c.ImagePullPolicy != corev1.PullNever || c.SecurityContext == nil || !*c.SecurityContext.Privileged {
		t.Errorf("agent container: image %q policy %q security %+v", c.Image, c.ImagePullPolicy, c.SecurityContext)
	}
	if c.TerminationMessagePolicy != corev1.TerminationMessageFallbackToLogsOnError {
		t.Errorf("agent termination message policy %q: an agent that refuses to start would not say why in its pod's state", c.TerminationMessagePolicy)
	}
	for _, a := range []string{"agent", "--run-dir=/run/berth", "--kubelet-dir=/var/lib/k8s-test/kubelet",
		"--csi-endpoint=unix:///var/lib/k8s-test/kubelet/plugins/berth.io/csi.sock",
		"--volume-plugin-dir=" + opts.VolumePluginDir, "--metrics-addr=:9741", "--health-addr=:9742"} {
		if !slices.Contains(c.Args, a) {
			t.Errorf("agent args %v lack %s", c.Args, a)
		}
	}
	if slices.ContainsFunc(c.Args, func(a string) bool { return strings.HasPrefix(a, "--userspace-transport") }) {
		t.Errorf("agent args %v set a transport: each cluster's is read at stage", c.Args)
	}
	if e := env1(c, "NODE_NAME"); e == nil || e.ValueFrom == nil || e.ValueFrom.FieldRef.FieldPath != "spec.nodeName" {
		t.Errorf("agent NODE_NAME env: %+v", e)
	}
	mounts := map[string]corev1.VolumeMount{}
	for _, m := range c.VolumeMounts {
		mounts[m.MountPath] = m
	}
	for _, dir := range []string{"/var/lib/k8s-test/kubelet/pods", "/var/lib/k8s-test/kubelet/plugins", "/run/berth"} {
		if m, ok := mounts[dir]; !ok || m.MountPropagation == nil || *m.MountPropagation != corev1.MountPropagationBidirectional {
			t.Errorf("agent mount %s: %+v, want Bidirectional", dir, m)
		}
	}
	if m := mounts["/srv/berth"]; m.MountPropagation == nil || *m.MountPropagation != corev1.MountPropagationHostToContainer {
		t.Errorf("agent mount of the data dir: %+v, want HostToContainer", m)
	}
	for _, dir := range []string{"/var/lib/k8s-test/kubelet/plugins_registry", "/srv/berth", "/dev", "/run/berth"} {
		if _, ok := mounts[dir]; !ok {
			t.Errorf("agent has no mount at %s (mounts: %v)", dir, slices.Collect(maps.Keys(mounts)))
		}
	}
	// The Flexvolume folder is reached through the node's root, never
	// mounted (kubelet could not make it on a read-only /usr).
	if _, ok := mounts[opts.VolumePluginDir]; ok {
		t.Errorf("agent mounts the Flexvolume folder %s", opts.VolumePluginDir)
	}
	if agent.Spec.UpdateStrategy.Type != appsv1.RollingUpdateDaemonSetStrategyType {
		t.Errorf("agent update strategy %q", agent.Spec.UpdateStrategy.Type)
	}

	// The keeper DaemonSet is applied after the agent's, in the same pass
	// (and may be there from an earlier test): wait for alpha's placement.
	keeper := &appsv1.DaemonSet{ObjectMeta: metav1.ObjectMeta{Name: "berth-keeper", Namespace: namespace}}
	eventually(t, "the keeper placed as alpha says", func(ctx context.Context) (bool, error) {
		err := env.Client.Get(ctx, client.ObjectKeyFromObject(keeper), keeper)
		return err == nil && nodeTerms(keeper.Spec.Template.Spec) == "storage=yes", client.IgnoreNotFound(err)
	})
	checkNodeWide(t, keeper)
	kc := keeper.Spec.Template.Spec.Containers[0]
	// A new keeper pod takes over beside the old one: a surge of 1, none
	// unavailable.
	ku := keeper.Spec.UpdateStrategy
	if ku.Type != appsv1.RollingUpdateDaemonSetStrategyType || ku.RollingUpdate == nil ||
		ku.RollingUpdate.MaxSurge == nil || ku.RollingUpdate.MaxSurge.String() != "1" ||
		ku.RollingUpdate.MaxUnavailable == nil || ku.RollingUpdate.MaxUnavailable.String() != "0" ||
		!*kc.SecurityContext.Privileged || !keeper.Spec.Template.Spec.HostPID ||
		!slices.Equal(kc.Args, []string{"keeper", "--socket=/run/berth/keeper.sock", "--health-addr=:9746"}) {
		t.Errorf("keeper: strategy %+v args %v", ku, kc.Args)
	}
	checkPlacement(t, "keeper", keeper.Spec.Template.Spec)
	checkPod(t, "keeper", keeper.Spec.Template.Spec, "system-node-critical")
	// The keeper sees no data dir: its FUSE mounts live in /run/berth, so a
	// cluster added after its pod started needs nothing of it.
	for _, m := range kc.VolumeMounts {
		if m.MountPath != "/run/berth" && m.MountPath != "/dev/fuse" {
			t.Errorf("keeper mounts %s", m.MountPath)
		}
	}
	// The keeper is probed for readiness over HTTP (it serves the socket
	// itself), and has no liveness probe: a restart would drop every FUSE
	// connection it holds.
	if rp := kc.ReadinessProbe; rp == nil || rp.HTTPGet == nil || rp.HTTPGet.Path != "/readyz" ||
		rp.HTTPGet.Port.String() != "health" || kc.LivenessProbe != nil ||
		!slices.ContainsFunc(kc.Ports, func(p corev1.ContainerPort) bool { return p.Name == "health" && p.ContainerPort == 9746 }) {
		t.Errorf("keeper probes: readiness %+v liveness %+v args %v ports %v", kc.ReadinessProbe, kc.LivenessProbe, kc.Args, kc.Ports)
	}
	checkEndpoints(t, agent.Spec.Template, "agent", 9741, 9742)

	dep := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Name: "berth-csi-controller", Namespace: namespace}}
	get(t, dep)
	checkNodeWide(t, dep)
	checkControllerDeployment(t, dep)
	checkEndpoints(t, dep.Spec.Template, "csi-controller", 9743, 9744)
	for component, port := range map[string]int32{"agent": 9741, "csi-controller": 9743} {
		svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "berth-" + component + "-metrics", Namespace: namespace}}
		get(t, svc)
		checkNodeWide(t, svc)
		want := map[string]string{"app.kubernetes.io/name": "berth", "app.kubernetes.io/instance": "berth", "app.kubernetes.io/component": component}
		if svc.Spec.ClusterIP != corev1.ClusterIPNone || !maps.Equal(svc.Spec.Selector, want) || len(svc.Spec.Ports) != 1 ||
			svc.Spec.Ports[0].Name != "metrics" || svc.Spec.Ports[0].Port != port || svc.Spec.Ports[0].TargetPort.StrVal != "metrics" {
			t.Errorf("scrape Service of %s: %+v", component, svc.Spec)
		}
	}

	drv := &storagev1.CSIDriver{ObjectMeta: metav1.ObjectMeta{Name: v1.DriverName}}
	get(t, drv)
	checkNodeWide(t, drv)
	if *drv.Spec.AttachRequired || !*drv.Spec.PodInfoOnMount || drv.Spec.StorageCapacity == nil || !*drv.Spec.StorageCapacity {
		t.Errorf("CSIDriver: attachRequired %v podInfoOnMount %v storageCapacity %v", *drv.Spec.AttachRequired, *drv.Spec.PodInfoOnMount, drv.Spec.StorageCapacity)
	}
	// kubelet applies a pod's fsGroup only when the policy says so for every fs type.
	if p := drv.Spec.FSGroupPolicy; p == nil || *p != storagev1.FileFSGroupPolicy {
		t.Errorf("CSIDriver: fsGroupPolicy %v, want File", ptr.Deref(p, ""))
	}
	// A driver made before the policy was set (mutable since 1.29) gets it.
	drv.Spec.FSGroupPolicy = ptr.To(storagev1.ReadWriteOnceWithFSTypeFSGroupPolicy)
	if err := env.Client.Update(testCtx(t), drv); err != nil {
		t.Fatal(err)
	}
	eventually(t, "CSIDriver gets fsGroupPolicy File back", func(ctx context.Context) (bool, error) {
		err := env.Client.Get(ctx, client.ObjectKeyFromObject(drv), drv)
		return ptr.Deref(drv.Spec.FSGroupPolicy, "") == storagev1.FileFSGroupPolicy, err
	})
	checkResources(t, dep.Spec.Template.Spec)
	// The agent's container is the node's userspace data path, and the
	// keeper answers its healer for every volume at once: no CPU limit to
	// throttle every volume's I/O.
	for name, pod := range map[string]corev1.PodSpec{"agent": agent.Spec.Template.Spec, "keeper": keeper.Spec.Template.Spec} {
		if got := pod.Containers[0].Resources; got.Requests.Cpu().IsZero() || got.Requests.Memory().IsZero() ||
			got.Limits.Memory().Cmp(*got.Requests.Memory()) < 0 || !got.Limits.Cpu().IsZero() {
			t.Errorf("%s resources %+v, want CPU and memory requests, a memory limit and no CPU limit", name, got)
		}
	}
	for name, mounter := range map[string]string{"alpha": "kernel", "alpha-userspace": "userspace"} {
		cls := &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: name}}
		get(t, cls)
		checkControlledBy(t, cls, sc)
		if cls.Provisioner != v1.DriverName || cls.Parameters["mounter"] != mounter || cls.Parameters["csi.storage.k8s.io/fstype"] != "ext4" ||
			cls.Parameters["storageCluster"] != "alpha" ||
			*cls.VolumeBindingMode != storagev1.VolumeBindingWaitForFirstConsumer || !*cls.AllowVolumeExpansion {
			t.Errorf("class %s: %+v", name, cls)
		}
		isDefault := cls.Annotations["storageclass.kubernetes.io/is-default-class"] == "true"
		if isDefault != (name == "alpha") {
			t.Errorf("class %s default=%v", name, isDefault)
		}
	}

	eventually(t, "finalizer and Progressing status", func(ctx context.Context) (bool, error) {
		err := env.Client.Get(ctx, client.ObjectKeyFromObject(sc), sc)
		return slices.Contains(sc.Finalizers, storagecluster.Finalizer) &&
			sc.Status.Phase == v1.StorageClusterProgressing && sc.Status.ObservedGeneration == sc.Generation, err
	})
}

// checkEndpoints wants the named container of a pod to serve metrics and
// health on the given ports (args and named ports), probed for liveness
// on /healthz and readiness on /readyz through the health port.
func checkEndpoints(t *testing.T, tpl corev1.PodTemplateSpec, name string, metricsPort, healthPort int32) {
	t.Helper()
	var c *corev1.Container
	for i := range tpl.Spec.Containers {
		if tpl.Spec.Containers[i].Name == name {
			c = &tpl.Spec.Containers[i]
		}
	}
	if c == nil {
		t.Fatalf("no container %s", name)
	}
	ports := map[string]int32{}
	for _, p := range c.Ports {
		ports[p.Name] = p.ContainerPort
	}
	if ports["metrics"] != metricsPort || ports["health"] != healthPort {
		t.Errorf("%s ports %v, want metrics %d, health %d", name, c.Ports, metricsPort, healthPort)
	}
	if !slices.Contains(c.Args, fmt.Sprintf("--metrics-addr=:%d", metricsPort)) || !slices.Contains(c.Args, fmt.Sprintf("--health-addr=:%d", healthPort)) {
		t.Errorf("%s args %v do not set its metrics and health addresses", name, c.Args)
	}
	for _, p := range []struct {
		probe *corev1.Probe
		path  string
	}{{c.LivenessProbe, "/healthz"}, {c.ReadinessProbe, "/readyz"}} {
		if p.probe == nil || p.probe.HTTPGet == nil || p.probe.HTTPGet.Path != p.path || p.probe.HTTPGet.Port.StrVal != "health" {
			t.Errorf("%s probe for %s: %+v", name, p.path, p.probe)
		}
	}
}

// checkResources wants CPU and memory requests and limits on every
// container, limits at least the requests.
func checkResources(t *testing.T, p corev1.PodSpec) {
	t.Helper()
	for _, c := range append(slices.Clone(p.InitContainers), p.Containers...) {
		for _, r := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
			req, okReq := c.Resources.Requests[r]
			lim, okLim := c.Resources.Limits[r]
			if !okReq || !okLim || req.IsZero() || lim.Cmp(req) < 0 {
				t.Errorf("container %s: %s request %v limit %v, want both, limit >= request", c.Name, r, c.Resources.Requests, c.Resources.Limits)
			}
		}
	}
}

func checkControllerDeployment(t *testing.T, dep *appsv1.Deployment) {
	t.Helper()
	p := dep.Spec.Template.Spec
	if p.HostNetwork || p.ServiceAccountName != "berth-csi-controller" || len(p.Containers) != 4 {
		t.Fatalf("controller pod: hostNetwork %v sa %q containers %d", p.HostNetwork, p.ServiceAccountName, len(p.Containers))
	}
	if sc := p.SecurityContext; sc == nil || sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot || sc.RunAsUser == nil || *sc.RunAsUser == 0 {
		t.Errorf("controller pod security context %+v, want a non-root user", sc)
	}
	checkPod(t, "csi-controller", p, "system-cluster-critical")
	byName := map[string]corev1.Container{}
	for _, c := range p.Containers {
		byName[c.Name] = c
		if sc := c.SecurityContext; sc == nil || (sc.Privileged != nil && *sc.Privileged) || sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation ||
			sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) || (sc.RunAsUser != nil && *sc.RunAsUser == 0) {
			t.Errorf("container %s security context %+v, want unprivileged, no capabilities", c.Name, sc)
		}
		if e := env1(c, "KUBERNETES_SERVICE_HOST"); e == nil || e.Value != "10.1.2.3" {
			t.Errorf("container %s: KUBERNETES_SERVICE_HOST %+v", c.Name, e)
		}
		if len(c.VolumeMounts) != 1 || c.VolumeMounts[0].MountPath != "/csi" {
			t.Errorf("container %s mounts %v", c.Name, c.VolumeMounts)
		}
	}
	want := map[string][]string{
		"csi-controller":  {"csi-controller", "--endpoint=unix:///csi/csi.sock", "--leader-elect", "--metrics-addr=:9743", "--health-addr=:9744"},
		"csi-provisioner": {"--csi-address=/csi/csi.sock", "--feature-gates=Topology=true", "--strict-topology", "--extra-create-metadata", "--leader-election"},
		"csi-resizer":     {"--csi-address=/csi/csi.sock", "--leader-election"},
		"csi-snapshotter": {"--csi-address=/csi/csi.sock", "--leader-election", "--extra-create-metadata"},
	}
	images := map[string]string{"csi-controller": opts.Image, "csi-provisioner": opts.ProvisionerImage,
		"csi-resizer": opts.ResizerImage, "csi-snapshotter": opts.SnapshotterImage}
	for name, args := range want {
		if c := byName[name]; !slices.Equal(c.Args, args) || c.Image != images[name] {
			t.Errorf("container %s: image %q args %v, want %q %v", name, c.Image, c.Args, images[name], args)
		}
	}
}

func TestStorageClusterSpecChangeRollsOut(t *testing.T) {
	suite.Require(t)
	sc := newCluster(t, "beta", v1.StorageClusterSpec{})
	agent := &appsv1.DaemonSet{ObjectMeta: metav1.ObjectMeta{Name: "berth-agent", Namespace: namespace}}
	eventually(t, "the agent serves beta's data dir, on every node", func(ctx context.Context) (bool, error) {
		err := env.Client.Get(ctx, client.ObjectKeyFromObject(agent), agent)
		return err == nil && agent.Spec.Template.Spec.Affinity == nil &&
			slices.Contains(agent.Spec.Template.Spec.Containers[0].Args, "--data-dir=/var/lib/berth"), client.IgnoreNotFound(err)
	})

	patch := []byte(`{"spec":{"dataDir":"/data/berth","agent":{"nodeSelector":{"zone":"a"},"tolerations":[{"operator":"Exists"}],"userspaceTransport":"nbd"}}}`)
	if err := env.Client.Patch(testCtx(t), sc, client.RawPatch(types.MergePatchType, patch)); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"berth-agent", "berth-keeper"} {
		ds := &appsv1.DaemonSet{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace}}
		eventually(t, name+" has the new placement", func(ctx context.Context) (bool, error) {
			err := env.Client.Get(ctx, client.ObjectKeyFromObject(ds), ds)
			p := ds.Spec.Template.Spec
			return nodeTerms(p) == "zone=a" && len(p.Tolerations) == 1 && p.Tolerations[0].Operator == corev1.TolerationOpExists, err
		})
	}
	eventually(t, "agent has the new data dir only", func(ctx context.Context) (bool, error) {
		err := env.Client.Get(ctx, client.ObjectKeyFromObject(agent), agent)
		args := agent.Spec.Template.Spec.Containers[0].Args
		return slices.Contains(args, "--data-dir=/data/berth") && !slices.Contains(args, "--data-dir=/var/lib/berth"), err
	})
	eventually(t, "status observes the new generation", func(ctx context.Context) (bool, error) {
		err := env.Client.Get(ctx, client.ObjectKeyFromObject(sc), sc)
		return sc.Generation > 1 && sc.Status.ObservedGeneration == sc.Generation, err
	})
}

func TestStorageClusterDeletedObjectsComeBack(t *testing.T) {
	suite.Require(t)
	newCluster(t, "gamma", v1.StorageClusterSpec{})
	objs := []client.Object{
		&appsv1.DaemonSet{ObjectMeta: metav1.ObjectMeta{Name: "berth-agent", Namespace: namespace}},
		&appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Name: "berth-csi-controller", Namespace: namespace}},
		&storagev1.CSIDriver{ObjectMeta: metav1.ObjectMeta{Name: v1.DriverName}},
		&storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: "gamma-userspace"}},
	}
	for _, o := range objs {
		get(t, o)
		old := o.GetUID()
		if err := env.Client.Delete(testCtx(t), o); err != nil {
			t.Fatal(err)
		}
		eventually(t, o.GetName()+" comes back", func(ctx context.Context) (bool, error) {
			err := env.Client.Get(ctx, client.ObjectKeyFromObject(o), o)
			return err == nil && o.GetUID() != old, client.IgnoreNotFound(err)
		})
	}
}

func TestStorageClusterConditions(t *testing.T) {
	suite.Require(t)
	sc := newCluster(t, "delta", v1.StorageClusterSpec{})
	agent := &appsv1.DaemonSet{ObjectMeta: metav1.ObjectMeta{Name: "berth-agent", Namespace: namespace}}
	keeper := &appsv1.DaemonSet{ObjectMeta: metav1.ObjectMeta{Name: "berth-keeper", Namespace: namespace}}
	dep := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Name: "berth-csi-controller", Namespace: namespace}}
	get(t, agent)
	get(t, keeper)
	get(t, dep)
	// The node-wide set outlives earlier tests' clusters: start from a
	// status that is not ready.
	setDaemonSetStatus(t, agent, 2, 1)
	setDaemonSetStatus(t, keeper, 2, 1)
	waitCondition(t, sc, storagecluster.ConditionAgentReady, metav1.ConditionFalse, storagecluster.ReasonProgressing)

	// envtest runs no DaemonSet controller: report what it would.
	setDaemonSetStatus(t, agent, 0, 0)
	waitCondition(t, sc, storagecluster.ConditionAgentReady, metav1.ConditionFalse, storagecluster.ReasonNoNodes)
	setDaemonSetStatus(t, agent, 2, 1)
	waitCondition(t, sc, storagecluster.ConditionAgentReady, metav1.ConditionFalse, storagecluster.ReasonProgressing)
	setDaemonSetStatus(t, agent, 2, 2)
	waitCondition(t, sc, storagecluster.ConditionAgentReady, metav1.ConditionTrue, storagecluster.ReasonReady)
	waitCondition(t, sc, v1.ConditionReady, metav1.ConditionFalse, storagecluster.ReasonNotReady)
	if !strings.Contains(meta.FindStatusCondition(sc.Status.Conditions, v1.ConditionReady).Message, "KeeperReady") {
		t.Errorf("Ready message does not name the keeper: %+v", sc.Status.Conditions)
	}

	setDaemonSetStatus(t, keeper, 2, 2)
	waitCondition(t, sc, storagecluster.ConditionKeeperReady, metav1.ConditionTrue, storagecluster.ReasonReady)
	dep.Status = appsv1.DeploymentStatus{
		ObservedGeneration: dep.Generation, Replicas: 1, UpdatedReplicas: 1, ReadyReplicas: 1, AvailableReplicas: 1,
		Conditions: []appsv1.DeploymentCondition{{Type: appsv1.DeploymentAvailable, Status: corev1.ConditionTrue, Reason: "MinimumReplicasAvailable"}},
	}
	if err := env.Client.Status().Update(testCtx(t), dep); err != nil {
		t.Fatal(err)
	}
	waitCondition(t, sc, storagecluster.ConditionControllerReady, metav1.ConditionTrue, storagecluster.ReasonReady)
	waitCondition(t, sc, v1.ConditionReady, metav1.ConditionTrue, storagecluster.ReasonReady)
	if sc.Status.Phase != v1.StorageClusterReady {
		t.Errorf("phase %q, want Ready", sc.Status.Phase)
	}
}

func setDaemonSetStatus(t *testing.T, ds *appsv1.DaemonSet, desired, available int32) {
	t.Helper()
	// The operator updates the node-wide set whenever any test's cluster
	// comes or goes: retry on its writes.
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		if err := env.Client.Get(testCtx(t), client.ObjectKeyFromObject(ds), ds); err != nil {
			return err
		}
		ds.Status = appsv1.DaemonSetStatus{
			ObservedGeneration: ds.Generation, DesiredNumberScheduled: desired, CurrentNumberScheduled: desired,
			UpdatedNumberScheduled: desired, NumberReady: available, NumberAvailable: available,
			NumberUnavailable: desired - available,
		}
		return env.Client.Status().Update(testCtx(t), ds)
	})
	if err != nil {
		t.Fatal(err)
	}
}

func waitCondition(t *testing.T, sc *v1.StorageCluster, typ string, status metav1.ConditionStatus, reason string) {
	t.Helper()
	eventually(t, typ+"="+string(status)+"/"+reason, func(ctx context.Context) (bool, error) {
		err := env.Client.Get(ctx, client.ObjectKeyFromObject(sc), sc)
		c := meta.FindStatusCondition(sc.Status.Conditions, typ)
		return c != nil && c.Status == status && c.Reason == reason, err
	})
}

// checkNodeWide wants obj owned by no StorageCluster and labelled as the
// node-wide set.
func checkNodeWide(t *testing.T, obj client.Object) {
	t.Helper()
	for _, ref := range obj.GetOwnerReferences() {
		if ref.Kind == "StorageCluster" {
			t.Errorf("%T %s is owned by StorageCluster %s", obj, obj.GetName(), ref.Name)
		}
	}
	if l := obj.GetLabels(); l["app.kubernetes.io/instance"] != storagecluster.NodeWide || l["app.kubernetes.io/managed-by"] != "berth-operator" {
		t.Errorf("%T %s labels %v", obj, obj.GetName(), l)
	}
}

// nodeTerms renders a pod's required node affinity as "k=v,k=v|k=v" (terms
// ORed), "" for none.
func nodeTerms(p corev1.PodSpec) string {
	if p.Affinity == nil || p.Affinity.NodeAffinity == nil || p.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution == nil {
		return ""
	}
	var terms []string
	for _, term := range p.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms {
		var reqs []string
		for _, r := range term.MatchExpressions {
			reqs = append(reqs, r.Key+"="+strings.Join(r.Values, "/"))
		}
		terms = append(terms, strings.Join(reqs, ","))
	}
	return strings.Join(terms, "|")
}

// checkPlacement wants alpha's placement (the only cluster in its test).
func checkPlacement(t *testing.T, what string, p corev1.PodSpec) {
	t.Helper()
	if nodeTerms(p) != "storage=yes" || len(p.Tolerations) != 1 || p.Tolerations[0].Key != "dedicated" {
		t.Errorf("%s placement: node terms %q tolerations %v", what, nodeTerms(p), p.Tolerations)
	}
}

// checkPod checks what every pod the operator renders carries: the pull
// secrets of its options and the priority class of its component.
func checkPod(t *testing.T, what string, p corev1.PodSpec, priority string) {
	t.Helper()
	if !slices.Equal(p.ImagePullSecrets, opts.ImagePullSecrets) {
		t.Errorf("%s pod: image pull secrets %v, want %v", what, p.ImagePullSecrets, opts.ImagePullSecrets)
	}
	if p.PriorityClassName != priority {
		t.Errorf("%s pod: priority class %q, want %q", what, p.PriorityClassName, priority)
	}
}

func checkControlledBy(t *testing.T, obj client.Object, sc *v1.StorageCluster) {
	t.Helper()
	ref := metav1.GetControllerOf(obj)
	if ref == nil || ref.UID != sc.UID || ref.Kind != "StorageCluster" {
		t.Errorf("%T %s controller %+v, want StorageCluster %s", obj, obj.GetName(), ref, sc.Name)
	}
}

func env1(c corev1.Container, name string) *corev1.EnvVar {
	for i := range c.Env {
		if c.Env[i].Name == name {
			return &c.Env[i]
		}
	}
	return nil
}

// TestReconcileWithoutChangeSendsNoUpdate: once everything is applied, a
// reconcile that changes nothing sends no Update of the owned objects
// (rendering replaces whole specs, which would otherwise differ from the
// server-defaulted objects on every pass).
func TestReconcileWithoutChangeSendsNoUpdate(t *testing.T) {
	suite.Require(t)
	sc := newCluster(t, "quiet", v1.StorageClusterSpec{})
	var updates []string
	counting := interceptedClient(t, interceptor.Funcs{
		Update: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.UpdateOption) error {
			updates = append(updates, fmt.Sprintf("%T %s", obj, obj.GetName()))
			return c.Update(ctx, obj, opts...)
		},
	})
	r := reconcilerOn(counting)
	req := ctrl.Request{NamespacedName: types.NamespacedName{Name: sc.Name}}
	// The manager's reconciler works on the same cluster meanwhile: the
	// first pass may race it (AlreadyExists, Conflict) until all is made.
	// A status write may also meet a Conflict: each pass is retried until
	// it succeeds, and only the successful pass's updates count.
	for range 2 {
		eventually(t, "a reconcile of quiet succeeds", func(ctx context.Context) (bool, error) {
			updates = nil
			_, err := r.Reconcile(ctx, req)
			return err == nil, err
		})
	}
	if len(updates) != 0 {
		t.Errorf("a reconcile without change sent updates: %v", updates)
	}
}

// TestStorageClusterRefusesSystemDataDir: a StorageCluster whose data dir is
// a system folder (written before the CRD refused it) gets an InvalidSpec
// condition, and nothing is deployed for it.
func TestStorageClusterRefusesSystemDataDir(t *testing.T) {
	suite.Require(t)
	sc := newCluster(t, "sysdir", v1.StorageClusterSpec{})
	var writes []string
	var status *v1.StorageCluster
	record := func(obj client.Object) { writes = append(writes, fmt.Sprintf("%T %s", obj, obj.GetName())) }
	c := interceptedClient(t, interceptor.Funcs{
		Get: func(ctx context.Context, c client.WithWatch, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
			err := c.Get(ctx, key, obj, opts...)
			if s, ok := obj.(*v1.StorageCluster); ok {
				s.Spec.DataDir = "/etc/berth"
			}
			return err
		},
		Create: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.CreateOption) error {
			record(obj)
			return c.Create(ctx, obj, opts...)
		},
		Update: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.UpdateOption) error {
			record(obj)
			return c.Update(ctx, obj, opts...)
		},
		// Kept here: the manager's reconciler owns the real object's status.
		SubResourcePatch: func(_ context.Context, _ client.Client, _ string, obj client.Object, _ client.Patch, _ ...client.SubResourcePatchOption) error {
			status = obj.(*v1.StorageCluster).DeepCopy()
			return nil
		},
	})
	r := reconcilerOn(c)
	if _, err := r.Reconcile(testCtx(t), ctrl.Request{NamespacedName: types.NamespacedName{Name: sc.Name}}); err != nil {
		t.Fatalf("reconcile: %v", err)
	}
	if len(writes) != 0 {
		t.Errorf("reconciling a cluster with data dir /etc/berth wrote %v, want nothing", writes)
	}
	if status == nil {
		t.Fatal("no status written")
	}
	ready := meta.FindStatusCondition(status.Status.Conditions, v1.ConditionReady)
	if status.Status.Phase != v1.StorageClusterError || ready == nil || ready.Reason != storagecluster.ReasonInvalidSpec ||
		!strings.Contains(ready.Message, "/etc/berth") {
		t.Errorf("status: phase %q Ready %+v, want Error / InvalidSpec naming /etc/berth", status.Status.Phase, ready)
	}
}
