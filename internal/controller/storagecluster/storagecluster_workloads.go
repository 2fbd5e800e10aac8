package storagecluster

import (
	"path"
	"strconv"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	v1 "github.com/berth-io/berth/api/v1alpha1"
)

// Components the operator deploys once for every cluster; each names its
// objects "berth-<component>" (NodeWide).
const (
	componentAgent      = "agent"
	componentKeeper     = "keeper"
	componentController = "csi-controller"
)

// Well-known labels on every owned object.
const (
	labelName      = "app.kubernetes.io/name"
	labelInstance  = "app.kubernetes.io/instance"
	labelComponent = "app.kubernetes.io/component"
	labelManagedBy = "app.kubernetes.io/managed-by"
	managedBy      = "berth-operator"
)

// KeeperSocket is where the keeper listens; the agent reaches it through the
// shared /run/berth host folder.
const KeeperSocket = "/run/berth/keeper.sock"

const (
	runDir        = "/run/berth"
	csiSocketDir  = "/csi"
	csiSocketPath = csiSocketDir + "/csi.sock"
)

// ObjectName is the name of a node-wide namespaced object of a component.
func ObjectName(component string) string { return NodeWide + "-" + component }

func (r *Reconciler) meta(component string) metav1.ObjectMeta {
	return metav1.ObjectMeta{Name: ObjectName(component), Namespace: r.Options.Namespace}
}

// selectorLabels pick a component's pods; they never change after creation
// (a workload's selector is immutable). instance is NodeWide for the
// node-wide set, the cluster's name for a cluster's own objects.
func selectorLabels(instance, component string) map[string]string {
	return map[string]string{labelName: "berth", labelInstance: instance, labelComponent: component}
}

func objectLabels(instance, component string) map[string]string {
	l := selectorLabels(instance, component)
	l[labelManagedBy] = managedBy
	return l
}

func setLabels(m *metav1.ObjectMeta, labels map[string]string) {
	if m.Labels == nil {
		m.Labels = map[string]string{}
	}
	for k, v := range labels {
		m.Labels[k] = v
	}
}

// agentDaemonSet renders the node agent: privileged on the host network, with
// the kubelet's pod and plugin folders shared both ways so that its mounts
// reach kubelet and the pods. It serves every cluster: it mounts each
// served data dir, and each cluster's userspace transport is read from the
// cluster at stage.
func (r *Reconciler) agentDaemonSet(plan nodeWidePlan, ds *appsv1.DaemonSet) {
	o := r.Options
	setLabels(&ds.ObjectMeta, objectLabels(NodeWide, componentAgent))
	if ds.Annotations == nil {
		ds.Annotations = map[string]string{}
	}
	ds.Annotations[annotationDataDirs] = dataDirsAnnotation(plan)
	dataMounts, dataVols := agentDataDirs(plan)
	podsDir := path.Join(o.KubeletDir, "pods")
	pluginsDir := path.Join(o.KubeletDir, "plugins")
	registryDir := path.Join(o.KubeletDir, "plugins_registry")
	endpoint := "unix://" + path.Join(pluginsDir, v1.DriverName, "csi.sock")
	bidi := ptr.To(corev1.MountPropagationBidirectional)

	// Without Flexvolume (no cluster asks, or the operator has no plugin
	// folder) the plugin folder is not named. It is never a hostPath
	// volume: on a node whose /usr is read-only kubelet could not make the
	// default one and the agent pod would never start. The agent reaches it
	// through the node's root (hostPID) and reports a failed install.
	pluginDir := ""
	if plan.flexvolume {
		pluginDir = o.VolumePluginDir
	}
	c := r.container(componentAgent, "agent",
		"--run-dir="+runDir,
		"--kubelet-dir="+o.KubeletDir,
		"--csi-endpoint="+endpoint,
		volumePluginDirFlag+pluginDir,
	)
	for _, d := range plan.dataDirs() {
		c.Args = append(c.Args, "--data-dir="+d)
	}
	withEndpoints(&c, AgentMetricsPort, AgentHealthPort, o.MetricsSecure)
	c.Env = append(c.Env, corev1.EnvVar{Name: "NODE_NAME", ValueFrom: &corev1.EnvVarSource{
		FieldRef: &corev1.ObjectFieldSelector{APIVersion: "v1", FieldPath: "spec.nodeName"},
	}}, podNamespaceEnv())
	c.SecurityContext = &corev1.SecurityContext{Privileged: ptr.To(true)}
	// An agent that refuses to start (records of a newer release on the
	// node) says why in the pod's last state too, not only in its log.
	c.TerminationMessagePolicy = corev1.TerminationMessageFallbackToLogsOnError
	c.Resources = plan.agentResources
	c.VolumeMounts = []corev1.VolumeMount{
		{Name: "pods-dir", MountPath: podsDir, MountPropagation: bidi},
		{Name: "plugins-dir", MountPath: pluginsDir, MountPropagation: bidi},
		{Name: "registration-dir", MountPath: registryDir},
	}
	volumes := []corev1.Volume{
		hostPathVolume("pods-dir", podsDir, corev1.HostPathDirectoryOrCreate),
		hostPathVolume("plugins-dir", pluginsDir, corev1.HostPathDirectoryOrCreate),
		hostPathVolume("registration-dir", registryDir, corev1.HostPathDirectoryOrCreate),
	}
	c.VolumeMounts = append(append(c.VolumeMounts, []corev1.VolumeMount{
		{Name: "dev", MountPath: "/dev"},
		// The keeper's FUSE mounts (userspace volumes) and the Flexvolume
		// staging folders live in /run/berth, in no cluster's data dir:
		// shared both ways so that they reach the agent and outlive its
		// container.
		{Name: "run-berth", MountPath: runDir, MountPropagation: bidi},
		// The holder records of netns-mode clusters: the agent finds each
		// cluster's holder namespace there (through the host's /proc).
		{Name: "holders-netns", MountPath: NetnsHolderDir, ReadOnly: true},
	}...), dataMounts...)
	ds.Spec = appsv1.DaemonSetSpec{
		Selector:       &metav1.LabelSelector{MatchLabels: selectorLabels(NodeWide, componentAgent)},
		UpdateStrategy: appsv1.DaemonSetUpdateStrategy{Type: appsv1.RollingUpdateDaemonSetStrategyType},
		Template: corev1.PodTemplateSpec{
			ObjectMeta: metav1.ObjectMeta{Labels: objectLabels(NodeWide, componentAgent)},
			Spec: corev1.PodSpec{
				ServiceAccountName: o.AgentServiceAccount,
				ImagePullSecrets:   o.ImagePullSecrets,
				// The node's userspace data path: the last pod the node
				// evicts, the last the OOM killer picks.
				PriorityClassName: PriorityNodeCritical,
				HostNetwork:       true,
				// Unstage refuses while any process on the node holds the
				// device open; only the host's PID namespace shows them all.
				HostPID:     true,
				DNSPolicy:   corev1.DNSClusterFirstWithHostNet,
				Affinity:    placement(plan),
				Tolerations: plan.tolerations,
				Containers:  []corev1.Container{c},
				Volumes: append(append(volumes,
					hostPathVolume("dev", "/dev", corev1.HostPathDirectory),
					hostPathVolume("run-berth", runDir, corev1.HostPathDirectoryOrCreate),
					hostPathVolume("holders-netns", NetnsHolderDir, corev1.HostPathDirectoryOrCreate),
				), dataVols...),
			},
		},
	}
}

// volumePluginDirFlag names kubelet's Flexvolume folder to the agent; an
// empty one installs no driver.
const volumePluginDirFlag = "--volume-plugin-dir="

// installsFlexvolume tells whether the agent DaemonSet ds installs the
// Flexvolume driver: its agent names a plugin folder.
func installsFlexvolume(ds *appsv1.DaemonSet) bool {
	for _, c := range ds.Spec.Template.Spec.Containers {
		for _, a := range c.Args {
			if dir, ok := strings.CutPrefix(a, volumePluginDirFlag); ok {
				return dir != ""
			}
		}
	}
	return false
}

// keeperDaemonSet renders the keeper. It holds kernel connections that must
// outlive everything else; a new keeper takes them over from the old one
// through its socket, so it rolls like the rest. It sees no data dir: its
// FUSE mounts live in /run/berth (the blockdev servers, in the agent's pod,
// read the images), so a cluster added after a keeper pod started needs
// nothing of it.
func (r *Reconciler) keeperDaemonSet(plan nodeWidePlan, ds *appsv1.DaemonSet) {
	setLabels(&ds.ObjectMeta, objectLabels(NodeWide, componentKeeper))
	c := r.container(componentKeeper, "keeper", "--socket="+KeeperSocket,
		"--health-addr=:"+strconv.Itoa(KeeperHealthPort))
	c.Ports = []corev1.ContainerPort{{Name: portHealth, ContainerPort: KeeperHealthPort, Protocol: corev1.ProtocolTCP}}
	c.SecurityContext = &corev1.SecurityContext{Privileged: ptr.To(true)}
	c.Resources = keeperResources
	c.ReadinessProbe = keeperReadiness()
	// The keeper mounts the FUSE file systems behind userspace volumes;
	// Bidirectional makes them visible on the host and to the agent.
	bidi := ptr.To(corev1.MountPropagationBidirectional)
	c.VolumeMounts = []corev1.VolumeMount{
		{Name: "fuse", MountPath: "/dev/fuse"},
		{Name: "run-berth", MountPath: runDir, MountPropagation: bidi},
	}
	ds.Spec = onDeleteDaemonSet(NodeWide, componentKeeper, nil, corev1.PodSpec{
		// The keeper never talks to the API server.
		AutomountServiceAccountToken: ptr.To(false),
		ImagePullSecrets:             r.Options.ImagePullSecrets,
		// Its loss drops every userspace volume's kernel connection.
		PriorityClassName: PriorityNodeCritical,
		// The keeper watches its clients (servers the agent starts in
		// the agent's pod) by pid: SO_PEERCRED gives 0 for a peer in
		// a pid namespace the keeper cannot see.
		HostPID:     true,
		Affinity:    placement(plan),
		Tolerations: plan.tolerations,
		Containers:  []corev1.Container{c},
		Volumes: []corev1.Volume{
			hostPathVolume("fuse", "/dev/fuse", corev1.HostPathCharDev),
			hostPathVolume("run-berth", runDir, corev1.HostPathDirectoryOrCreate),
		},
	})
	// The new pod starts beside the old one (a surge of 1, none
	// unavailable), takes every connection and the socket over, and only
	// then is ready (its probe asks which keeper answers); the old pod,
	// deleted after, holds nothing and exits at once. Deleting the old pod
	// first would drop every userspace volume's connection on the node.
	ds.Spec.UpdateStrategy = appsv1.DaemonSetUpdateStrategy{
		Type: appsv1.RollingUpdateDaemonSetStrategyType,
		RollingUpdate: &appsv1.RollingUpdateDaemonSet{
			MaxSurge: ptr.To(intstr.FromInt32(1)), MaxUnavailable: ptr.To(intstr.FromInt32(0)),
		},
	}
}

// onDeleteDaemonSet is the spec of a component's DaemonSet whose pods are
// replaced only when someone deletes them, with annotations on each pod.
func onDeleteDaemonSet(instance, component string, annotations map[string]string, pod corev1.PodSpec) appsv1.DaemonSetSpec {
	return appsv1.DaemonSetSpec{
		Selector:       &metav1.LabelSelector{MatchLabels: selectorLabels(instance, component)},
		UpdateStrategy: appsv1.DaemonSetUpdateStrategy{Type: appsv1.OnDeleteDaemonSetStrategyType},
		Template: corev1.PodTemplateSpec{
			ObjectMeta: metav1.ObjectMeta{Labels: objectLabels(instance, component), Annotations: annotations},
			Spec:       pod,
		},
	}
}

// controllerDeployment renders berth csi-controller with the standard CSI
// sidecars. They talk only to the API server and to each other over a
// socket in an emptyDir, so they run on the pod network, as a non-root user
// with no capabilities; with APIServerHost set they reach the API server
// there (clusters without kube-proxy). It serves every cluster: a class's
// storageCluster parameter names a new volume's. A ceph cluster on multus
// has its monitors on the public network only, so the pod joins every such
// cluster's public network (as Rook gives its CSI provisioner the
// CephCluster's public network). It needs no holder: it mounts nothing, so
// a restart cuts no volume's network, and a new pod's new interface is all
// it needs.
func (r *Reconciler) controllerDeployment(plan nodeWidePlan, d *appsv1.Deployment) {
	o := r.Options
	setLabels(&d.ObjectMeta, objectLabels(NodeWide, componentController))
	socket := []corev1.VolumeMount{{Name: "socket-dir", MountPath: csiSocketDir}}
	csiAddr := "--csi-address=" + csiSocketPath

	// Off is spelled out: an argument left out would not count as a change
	// of the Deployment (createOrUpdate). berth's own election keeps its
	// pool capacity publisher to one replica.
	elect, berthElect := "--leader-election", "--leader-elect"
	if !plan.controller.leaderElection {
		elect, berthElect = elect+"=false", berthElect+"=false"
	}
	berth := r.container(componentController, "csi-controller",
		"--endpoint=unix://"+csiSocketPath, berthElect,
	)
	berth.Env = append(berth.Env, podNamespaceEnv())
	withEndpoints(&berth, ControllerMetricsPort, ControllerHealthPort, r.Options.MetricsSecure)
	// No livenessprobe sidecar: the module proxy does not serve it here
	// (hack/csi-sidecars.sh builds these three). What it would check, the
	// CSI controller answering, is berth's own /healthz liveness; the
	// sidecars exit by themselves when they lose the CSI socket.
	provisioner := r.sidecar("csi-provisioner", o.ProvisionerImage, csiAddr,
		"--feature-gates=Topology=true", "--strict-topology", "--extra-create-metadata", elect)
	resizer := r.sidecar("csi-resizer", o.ResizerImage, csiAddr, elect)
	snapshotter := r.sidecar("csi-snapshotter", o.SnapshotterImage, csiAddr, elect, "--extra-create-metadata")
	containers := []corev1.Container{berth, provisioner, resizer, snapshotter}
	for i := range containers {
		containers[i].VolumeMounts = socket
		containers[i].Resources = controllerResources
		containers[i].SecurityContext = &corev1.SecurityContext{
			AllowPrivilegeEscalation: ptr.To(false),
			ReadOnlyRootFilesystem:   ptr.To(true),
			Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
		}
	}
	// Only berth's container takes spec.csiController.resources.
	containers[0].Resources = plan.controllerResources
	d.Spec = appsv1.DeploymentSpec{
		Replicas: ptr.To(plan.controller.replicas),
		Selector: &metav1.LabelSelector{MatchLabels: selectorLabels(NodeWide, componentController)},
		Template: corev1.PodTemplateSpec{
			ObjectMeta: metav1.ObjectMeta{Labels: objectLabels(NodeWide, componentController), Annotations: controllerNetworks(plan)},
			Spec: corev1.PodSpec{
				ServiceAccountName: o.ControllerServiceAccount,
				ImagePullSecrets:   o.ImagePullSecrets,
				PriorityClassName:  PriorityClusterCritical,
				SecurityContext: &corev1.PodSecurityContext{
					RunAsNonRoot:   ptr.To(true),
					RunAsUser:      ptr.To(nonRootUID),
					RunAsGroup:     ptr.To(nonRootUID),
					FSGroup:        ptr.To(nonRootUID),
					SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
				},
				Containers: containers,
				Volumes: []corev1.Volume{{Name: "socket-dir", VolumeSource: corev1.VolumeSource{
					EmptyDir: &corev1.EmptyDirVolumeSource{},
				}}},
			},
		},
	}
}

// controllerScale is how many CSI controller pods run, and whether their
// sidecars elect a leader.
type controllerScale struct {
	replicas       int32
	leaderElection bool
}

// controllerScaleOf merges what clusters ask of the one CSI controller
// that serves them all: the most replicas, and leader election unless
// every cluster turns it off (more than one replica always elects). No
// cluster: one replica, electing.
func controllerScaleOf(clusters []*v1.StorageCluster) controllerScale {
	s := controllerScale{replicas: 1, leaderElection: len(clusters) == 0}
	for _, sc := range clusters {
		c := sc.Spec.CSIController
		s.replicas = max(s.replicas, ptr.Deref(c.Replicas, 1))
		s.leaderElection = s.leaderElection || ptr.Deref(c.LeaderElection, true)
	}
	s.leaderElection = s.leaderElection || s.replicas > 1
	return s
}

// container is a berth container running one command of the multi-call binary.
func (r *Reconciler) container(name, command string, args ...string) corev1.Container {
	c := r.sidecar(name, r.Options.Image, args...)
	c.Args = append([]string{command}, args...)
	return c
}

func (r *Reconciler) sidecar(name, image string, args ...string) corev1.Container {
	return corev1.Container{
		Name:            name,
		Image:           image,
		ImagePullPolicy: r.Options.ImagePullPolicy,
		Args:            args,
		Env:             r.apiServerEnv(),
	}
}

// apiServerEnv points in-cluster clients at the API server directly, for
// clusters where the kubernetes Service is not reachable (no kube-proxy).
func (r *Reconciler) apiServerEnv() []corev1.EnvVar {
	var env []corev1.EnvVar
	if r.Options.APIServerHost != "" {
		env = append(env, corev1.EnvVar{Name: "KUBERNETES_SERVICE_HOST", Value: r.Options.APIServerHost})
	}
	if r.Options.APIServerPort != "" {
		env = append(env, corev1.EnvVar{Name: "KUBERNETES_SERVICE_PORT", Value: r.Options.APIServerPort})
	}
	return env
}

// podNamespaceEnv tells a berth process its namespace (berth's), where the
// agents' CSIStorageCapacity objects live.
func podNamespaceEnv() corev1.EnvVar {
	return corev1.EnvVar{Name: "POD_NAMESPACE", ValueFrom: &corev1.EnvVarSource{
		FieldRef: &corev1.ObjectFieldSelector{APIVersion: "v1", FieldPath: "metadata.namespace"},
	}}
}

func hostPathVolume(name, p string, t corev1.HostPathType) corev1.Volume {
	return corev1.Volume{Name: name, VolumeSource: corev1.VolumeSource{
		HostPath: &corev1.HostPathVolumeSource{Path: p, Type: ptr.To(t)},
	}}
}
