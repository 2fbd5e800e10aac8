package storagecluster

import (
	"context"
	"encoding/json"
	"fmt"
	"path"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/berth-io/berth/api/v1alpha1"
	"github.com/berth-io/berth/internal/network"
)

// The multus components. A holder DaemonSet belongs to its cluster: it
// joins that cluster's public network in that cluster's mode, and goes
// when the cluster stops asking for it (or is deleted, after its cleanup).
// The mover is node-wide, like the keeper: it works on the node's host
// namespace and every holder record in its folder, so two would fight.
const (
	componentHolder = "holder"
	componentMover  = "mover"
)

// Where holders publish their records (network.Record). The mover copies
// every record in MoverHolderDir, so only holders of mover-mode clusters
// write there; a netns-mode cluster's holders write to
// NetnsHolderDir/<cluster>, where the agent finds that cluster's namespace
// and no mover ever moves it.
const (
	MoverHolderDir = network.DefaultDir
	NetnsHolderDir = network.NetnsDir
)

// HolderInterface is the name of the storage interface in a holder pod.
const HolderInterface = "net1"

// AnnotationNetworks is multus' pod annotation that selects networks.
const AnnotationNetworks = "k8s.v1.cni.cncf.io/networks"

// PriorityNodeCritical is the highest priority class: holders, movers,
// the agent and the keeper are the last pods a node evicts, since their
// loss cuts mounted volumes' network or I/O.
const PriorityNodeCritical = "system-node-critical"

// PriorityClusterCritical is the class of the CSI controller: no volume
// is made, grown or snapshotted without it, but its loss cuts no I/O.
const PriorityClusterCritical = "system-cluster-critical"

var (
	holderResources = resources("5m", "8Mi", "100m", "64Mi")
	moverResources  = resources("10m", "16Mi", "200m", "128Mi")
)

// HolderName is the name of a cluster's holder DaemonSet.
func HolderName(cluster string) string { return ObjectName(componentHolder) + "-" + cluster }

// wantsHolder: a multus cluster with a public network has a holder.
func wantsHolder(sc *v1.StorageCluster) bool {
	n := sc.Spec.Network
	return n.Provider == v1.NetworkProviderMultus && n.Selectors != nil && n.Selectors.Public != ""
}

// holderDir is the folder sc's holders publish in.
func holderDir(sc *v1.StorageCluster) string {
	if sc.Spec.Network.MultusMode() == v1.MultusModeMover {
		return MoverHolderDir
	}
	return path.Join(NetnsHolderDir, sc.Name)
}

// applyHolder creates or updates sc's holder DaemonSet, or deletes it when
// sc wants none. It returns the DaemonSet as found or made (no
// ResourceVersion: none).
func (r *Reconciler) applyHolder(ctx context.Context, sc *v1.StorageCluster) (*appsv1.DaemonSet, error) {
	ds := &appsv1.DaemonSet{ObjectMeta: metav1.ObjectMeta{Name: HolderName(sc.Name), Namespace: r.Options.Namespace}}
	if wantsHolder(sc) {
		return ds, r.ensure(ctx, sc, ds, func() { r.holderDaemonSet(sc, ds) })
	}
	err := r.Client.Get(ctx, client.ObjectKeyFromObject(ds), ds)
	if apierrors.IsNotFound(err) {
		return &appsv1.DaemonSet{}, nil
	}
	if err != nil {
		return &appsv1.DaemonSet{}, fmt.Errorf("holder DaemonSet: %w", err)
	}
	if c := metav1.GetControllerOf(ds); c == nil || c.UID != sc.UID {
		return &appsv1.DaemonSet{}, nil
	}
	return &appsv1.DaemonSet{}, r.deleteExact(ctx, ds)
}

// deleteExact deletes obj as read (same UID), never a namesake made since.
func (r *Reconciler) deleteExact(ctx context.Context, obj client.Object) error {
	err := r.Client.Delete(ctx, obj, client.Preconditions{UID: ptr.To(obj.GetUID())}, client.PropagationPolicy(metav1.DeletePropagationBackground))
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("delete %T %s: %w", obj, obj.GetName(), err)
	}
	return nil
}

// holderNetworks is the multus annotation that puts a holder on the public
// network, with the interface name the holder looks for.
func holderNetworks(public string) string {
	ns, name, _ := strings.Cut(public, "/")
	b, _ := json.Marshal([]map[string]string{{"name": name, "namespace": ns, "interface": HolderInterface}}) // strings always marshal
	return string(b)
}

// controllerNetworks is the CSI controller pod's multus annotation: the
// public networks of plan (nil without any).
func controllerNetworks(plan nodeWidePlan) map[string]string {
	if len(plan.publicNetworks) == 0 {
		return nil
	}
	nets := make([]map[string]string, 0, len(plan.publicNetworks))
	for _, pub := range plan.publicNetworks {
		ns, name, _ := strings.Cut(pub, "/")
		nets = append(nets, map[string]string{"name": name, "namespace": ns})
	}
	b, _ := json.Marshal(nets) // strings always marshal
	return map[string]string{AnnotationNetworks: string(b)}
}

// holderDaemonSet renders sc's holder: a tiny process on the public
// network that only keeps the interface and publishes a record of it. It
// needs no privilege, host namespace or API access; it is replaced only
// when someone deletes its pod (OnDelete), since a new pod means a new
// interface.
func (r *Reconciler) holderDaemonSet(sc *v1.StorageCluster, ds *appsv1.DaemonSet) {
	setLabels(&ds.ObjectMeta, objectLabels(sc.Name, componentHolder))
	dir := holderDir(sc)
	c := r.container(componentHolder, "holder", "--dir="+dir, "--interface="+HolderInterface)
	if m := sc.Spec.Network.Multus; m != nil && m.HolderImage != "" {
		c.Image = m.HolderImage
	}
	c.Env = []corev1.EnvVar{fieldEnv("POD_UID", "metadata.uid"), fieldEnv("POD_NAME", "metadata.name"), podNamespaceEnv()}
	c.Resources = holderResources
	// Root only for writing its record in the root-owned host folder.
	c.SecurityContext = &corev1.SecurityContext{
		AllowPrivilegeEscalation: ptr.To(false),
		ReadOnlyRootFilesystem:   ptr.To(true),
		Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
	}
	c.VolumeMounts = []corev1.VolumeMount{{Name: "holders", MountPath: dir}}
	// Ready once its record is published (HolderReady counts it). No
	// liveness probe: a holder that stops withdraws its record, and the
	// mover gives the interface back, a network cut under mounted volumes;
	// the holder only sleeps, there is nothing to hang.
	c.ReadinessProbe = &corev1.Probe{
		ProbeHandler: corev1.ProbeHandler{Exec: &corev1.ExecAction{
			Command: []string{"berth", "holder", "--dir=" + dir, "--ready"},
		}},
		TimeoutSeconds: 5, PeriodSeconds: 10, SuccessThreshold: 1, FailureThreshold: 3,
	}
	var affinity *corev1.Affinity
	if sel := sc.Spec.Agent.NodeSelector; len(sel) > 0 {
		affinity = placement(nodeWidePlan{nodeTerms: []corev1.NodeSelectorTerm{selectorTerm(sel)}})
	}
	networks := map[string]string{AnnotationNetworks: holderNetworks(sc.Spec.Network.Selectors.Public)}
	ds.Spec = onDeleteDaemonSet(sc.Name, componentHolder, networks, corev1.PodSpec{
		AutomountServiceAccountToken: ptr.To(false),
		ImagePullSecrets:             r.Options.ImagePullSecrets,
		PriorityClassName:            PriorityNodeCritical,
		Affinity:                     affinity,
		Tolerations:                  sc.Spec.Agent.Tolerations,
		Containers:                   []corev1.Container{c},
		Volumes:                      []corev1.Volume{hostPathVolume("holders", dir, corev1.HostPathDirectoryOrCreate)},
	})
}

// moverDaemonSet renders the node-wide mover: on the host network and PID
// namespace (it finds holders' namespaces under the host's /proc and makes
// interfaces there), with NET_ADMIN and SYS_ADMIN (setns). It runs where
// the agent does. OnDelete: a stopping mover gives every interface back to
// its holder, a network cut that only an administrator should choose.
func (r *Reconciler) moverDaemonSet(plan nodeWidePlan, ds *appsv1.DaemonSet) {
	setLabels(&ds.ObjectMeta, objectLabels(NodeWide, componentMover))
	c := r.container(componentMover, "mover", "--dir="+MoverHolderDir, "--proc=/proc")
	c.Env = nil // it never talks to the API server
	c.Resources = moverResources
	c.SecurityContext = &corev1.SecurityContext{
		Privileged:   ptr.To(true),
		Capabilities: &corev1.Capabilities{Add: []corev1.Capability{"NET_ADMIN", "SYS_ADMIN"}},
	}
	c.VolumeMounts = []corev1.VolumeMount{{Name: "holders", MountPath: MoverHolderDir}}
	// No probes on purpose. Liveness: a restart removes every copy and
	// gives the interfaces back, the network cut OnDelete avoids; a round
	// that fails is logged and retried, so the loop does not hang on one.
	// Readiness: no Service selects the mover, and a round's outcome is
	// per holder (the next round retries), not one state to probe.
	ds.Spec = onDeleteDaemonSet(NodeWide, componentMover, nil, corev1.PodSpec{
		AutomountServiceAccountToken: ptr.To(false),
		ImagePullSecrets:             r.Options.ImagePullSecrets,
		PriorityClassName:            PriorityNodeCritical,
		HostNetwork:                  true,
		HostPID:                      true,
		Affinity:                     placement(plan),
		Tolerations:                  plan.tolerations,
		Containers:                   []corev1.Container{c},
		Volumes:                      []corev1.Volume{hostPathVolume("holders", MoverHolderDir, corev1.HostPathDirectoryOrCreate)},
	})
}

// applyMover makes the mover when plan wants it and removes berth's
// mover otherwise.
func (r *Reconciler) applyMover(ctx context.Context, plan nodeWidePlan, ds *appsv1.DaemonSet) error {
	if plan.mover {
		return r.ensureNodeWide(ctx, ds, func() { r.moverDaemonSet(plan, ds) })
	}
	return r.removeNodeWide(ctx, ds)
}

func fieldEnv(name, fieldPath string) corev1.EnvVar {
	return corev1.EnvVar{Name: name, ValueFrom: &corev1.EnvVarSource{
		FieldRef: &corev1.ObjectFieldSelector{APIVersion: "v1", FieldPath: fieldPath},
	}}
}
