package sharemanager

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	v1 "github.com/berth-io/berth/api/v1alpha1"
	"github.com/berth-io/berth/internal/share"
	"github.com/berth-io/berth/internal/volid"
)

// Labels on share-manager pods and Services.
const (
	labelName      = "app.kubernetes.io/name"
	labelComponent = "app.kubernetes.io/component"
	// LabelShare names the share (its Service's name) a pod serves; the
	// Service selects on it.
	LabelShare = "berth.io/share-manager"
)

// Where the share-manager container finds its things.
const (
	devicePath = "/dev/berth-share"
	stateDir   = "/run/berth/share"
	nfsPort    = 2049
)

// HealthPort is where a share-manager pod serves its probes (/healthz,
// /readyz): the chart's NetworkPolicy admits it beside NFS.
const HealthPort = 9745

// Name is the name of a volume's share-manager pod, Service and claim:
// share-manager-<volume>, cut to a DNS label (63) with a hash when the
// volume name is long, since a Service name must be one.
func Name(volume string) string {
	const prefix, limit = "share-manager-", 63
	n := prefix + volume
	if len(n) <= limit {
		return n
	}
	sum := sha256.Sum256([]byte(volume))
	h := hex.EncodeToString(sum[:])[:10]
	head := n[:limit-len(h)-1]
	for head[len(head)-1] == '-' || head[len(head)-1] == '.' {
		head = head[:len(head)-1]
	}
	return head + "-" + h
}

// Endpoint is the NFS endpoint of a volume's share: its Service's cluster
// DNS name and the export /<volume>.
func Endpoint(namespace, volume string) string {
	return fmt.Sprintf("nfs://%s.%s.svc/%s", Name(volume), namespace, volume)
}

func labels(volume string) map[string]string {
	return map[string]string{labelName: "berth", labelComponent: "share-manager", LabelShare: Name(volume)}
}

// podFor is the share-manager pod of sm's volume. The pod reaches the
// volume as a raw block device through its claim (an ordinary RWO
// attachment on its node), so the share manager mounts and formats it
// itself. Restarts are left to the controller (restartPolicy Never): a pod
// that failed is replaced, possibly on another node, never restarted in place.
//
// seenVersion and seenFor (leaseSeen), when set, tell the share manager how
// long the controller has seen the Lease's current version unchanged.
func (r *Reconciler) podFor(sm *v1.ShareManager, vol *v1.Volume, rwx rwxSettings, seenVersion string, seenFor time.Duration) *corev1.Pod {
	name := Name(vol.Name)
	args := []string{
		"share-manager",
		"--volume=" + vol.Name,
		"--device=" + devicePath,
		"--state-dir=" + stateDir,
		"--health-addr=:" + strconv.Itoa(HealthPort),
		"--lease-namespace=" + sm.Namespace,
		"--lease-name=" + vol.Name,
		// Its spec.clients are the addresses ganesha admits.
		"--share-manager=" + sm.Name,
		// Unique per pod (leaseHolder): a replacement under the same name
		// must not mistake the old pod's Lease for its own.
		"--lease-holder=$(POD_NAME)_$(POD_UID)",
		"--lease-duration=" + strconv.Itoa(int(rwx.leaseDuration.Seconds())) + "s",
		// Both, so that a share-manager binary with other defaults
		// still serves the lease the grace was raised to.
		"--nfs-lease=" + strconv.Itoa(int(share.DefaultLeaseLifetime.Seconds())) + "s",
		"--nfs-grace=" + strconv.Itoa(int(rwx.grace.Seconds())) + "s",
	}
	if seenVersion != "" {
		args = append(args, "--lease-seen-version="+seenVersion, "--lease-seen-for="+seenFor.Truncate(time.Millisecond).String())
	}
	if vol.Spec.FSType != "" {
		args = append(args, "--fs-type="+vol.Spec.FSType)
	}
	if vol.Spec.RootSquash {
		args = append(args, "--root-squash")
	}
	if cidrs := clientCIDRs(rwx.cluster); len(cidrs) > 0 {
		args = append(args, "--clients="+strings.Join(cidrs, ","))
	}
	if why := vol.NeverFormatReason(); why != "" {
		args = append(args, "--never-format="+why)
	}
	env := []corev1.EnvVar{
		{Name: "POD_NAME", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{APIVersion: "v1", FieldPath: "metadata.name"}}},
		{Name: "POD_UID", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{APIVersion: "v1", FieldPath: "metadata.uid"}}},
	}
	if r.Options.APIServerHost != "" {
		env = append(env, corev1.EnvVar{Name: "KUBERNETES_SERVICE_HOST", Value: r.Options.APIServerHost})
	}
	if r.Options.APIServerPort != "" {
		env = append(env, corev1.EnvVar{Name: "KUBERNETES_SERVICE_PORT", Value: r.Options.APIServerPort})
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: sm.Namespace, Labels: labels(vol.Name)},
		Spec: corev1.PodSpec{
			RestartPolicy:      corev1.RestartPolicyNever,
			ServiceAccountName: r.Options.ServiceAccount,
			ImagePullSecrets:   r.Options.ImagePullSecrets,
			// Every client of the volume waits while it is down.
			PriorityClassName:             "system-cluster-critical",
			TerminationGracePeriodSeconds: ptr.To[int64](30),
			Affinity:                      placement(vol, sm.Status.FailedNode),
			Containers: []corev1.Container{{
				Name:            "share-manager",
				Image:           sm.Spec.Image,
				ImagePullPolicy: r.Options.ImagePullPolicy,
				Args:            args,
				Env:             env,
				Ports: []corev1.ContainerPort{{Name: "nfs", ContainerPort: nfsPort, Protocol: corev1.ProtocolTCP},
					{Name: "health", ContainerPort: HealthPort, Protocol: corev1.ProtocolTCP}},
				Resources:       rwx.resources,
				SecurityContext: shareManagerSecurity(),
				// Every second: after a failover clients reach the new
				// pod only once the Service lists it, i.e. once it is
				// Ready, so each second of probe period is failover time.
				// Over HTTP, not exec: an exec of the berth binary in the
				// pod took over 5 s on a busy slow node (a TCG VM) and
				// kept a serving share out of its Service for minutes. A
				// single slow probe must still not take a serving share
				// out (clients stall). Failover itself rests on the Lease,
				// not on readiness.
				ReadinessProbe: &corev1.Probe{
					ProbeHandler:  corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/readyz", Port: intstr.FromString("health")}},
					PeriodSeconds: 1, TimeoutSeconds: 5, FailureThreshold: 3,
				},
				// Liveness reads the share manager's heartbeat, which it
				// writes while it waits for its device or Lease and through
				// the NFS grace period too: a kill there (the pod fails, no
				// restart) would only start a new one that waits and
				// graces again. Generous: three minutes without a heartbeat
				// (written every 10 s) before the kill.
				LivenessProbe: &corev1.Probe{
					ProbeHandler:        corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/healthz", Port: intstr.FromString("health")}},
					InitialDelaySeconds: 30, PeriodSeconds: 30, TimeoutSeconds: 10, FailureThreshold: 5,
				},
				VolumeDevices: []corev1.VolumeDevice{{Name: "volume", DevicePath: devicePath}},
			}},
			Volumes: []corev1.Volume{{Name: "volume", VolumeSource: corev1.VolumeSource{
				PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: name},
			}}},
		},
	}
	return pod
}

// leaseHolder is the holder identity pod writes into its Lease (the
// --lease-holder flag, expanded by the kubelet).
func leaseHolder(pod *corev1.Pod) string { return pod.Name + "_" + string(pod.UID) }

// placement keeps a local volume's share manager on the node that holds the
// image (nowhere else can serve it), and steers any other away from the node
// whose share manager failed last. Preferred, not required: a cluster with
// one healthy node must still get its share back, and a lost node is
// avoided anyway (it is tainted unreachable).
func placement(vol *v1.Volume, failedNode string) *corev1.Affinity {
	if vol.Spec.Node != "" {
		return &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{
			RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
				MatchFields: []corev1.NodeSelectorRequirement{{Key: "metadata.name", Operator: corev1.NodeSelectorOpIn, Values: []string{vol.Spec.Node}}},
			}}},
		}}
	}
	if failedNode == "" {
		return nil
	}
	return &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{
		PreferredDuringSchedulingIgnoredDuringExecution: []corev1.PreferredSchedulingTerm{{
			Weight: 100,
			Preference: corev1.NodeSelectorTerm{
				MatchFields: []corev1.NodeSelectorRequirement{{Key: "metadata.name", Operator: corev1.NodeSelectorOpNotIn, Values: []string{failedNode}}},
			},
		}},
	}}
}

// claimFor and volumeFor bind the share-manager pod to its volume as a raw
// block device: a static PersistentVolume on the same backend image and a
// claim in the pod's namespace, pre-bound to each other. The PV's handle is
// volid.ShareDevice of the volume, not the volume's own: kubelet keys its
// volume state by driver and handle, and with one handle for both a
// workload's filesystem stage on the share manager's node made kubelet skip
// the share manager's block stage ("volume is not staged on this node"), or
// tear it down as the workload's and leave it staged. Retain: removing them
// never deletes the image, which stays the user's volume.
func claimFor(sm *v1.ShareManager, vol *v1.Volume) *corev1.PersistentVolumeClaim {
	name := Name(vol.Name)
	return &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: sm.Namespace, Labels: labels(vol.Name)},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes:      []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			VolumeMode:       ptr.To(corev1.PersistentVolumeBlock),
			StorageClassName: ptr.To(""),
			VolumeName:       name,
			Resources:        corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: vol.Spec.Size}},
		},
	}
}

// stageSecret, when set, is the cephx client's Secret: kubelet hands it to
// NodeStageVolume, as for the volume's own PV (its class names it), and a
// ceph node cannot stage without it.
func volumeFor(sm *v1.ShareManager, vol *v1.Volume, stageSecret *corev1.SecretReference) *corev1.PersistentVolume {
	name := Name(vol.Name)
	// The volume context the CSI controller gives its volumes.
	attrs := map[string]string{"mounter": string(vol.Spec.Mounter)}
	if vol.Spec.Node != "" {
		attrs["node"] = vol.Spec.Node
	}
	return &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels(vol.Name)},
		Spec: corev1.PersistentVolumeSpec{
			AccessModes:                   []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			VolumeMode:                    ptr.To(corev1.PersistentVolumeBlock),
			Capacity:                      corev1.ResourceList{corev1.ResourceStorage: vol.Spec.Size},
			PersistentVolumeReclaimPolicy: corev1.PersistentVolumeReclaimRetain,
			StorageClassName:              "",
			ClaimRef:                      &corev1.ObjectReference{Kind: "PersistentVolumeClaim", APIVersion: "v1", Namespace: sm.Namespace, Name: name},
			PersistentVolumeSource: corev1.PersistentVolumeSource{CSI: &corev1.CSIPersistentVolumeSource{
				Driver: v1.DriverName, VolumeHandle: volid.ShareDevice(vol.Name), VolumeAttributes: attrs, NodeStageSecretRef: stageSecret,
			}},
		},
	}
}

// serviceFor is the Service that always points at the volume's current
// share-manager pod: the endpoint workloads mount survives every failover.
func serviceFor(sm *v1.ShareManager) *corev1.Service {
	return &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: Name(sm.Spec.Volume), Namespace: sm.Namespace, Labels: labels(sm.Spec.Volume)},
		Spec: corev1.ServiceSpec{
			Selector: map[string]string{LabelShare: Name(sm.Spec.Volume)},
			Ports: []corev1.ServicePort{{
				Name: "nfs", Port: nfsPort, TargetPort: intstr.FromString("nfs"), Protocol: corev1.ProtocolTCP,
			}},
		},
	}
}

// shareManagerSecurity is what the share manager needs and no more (F9):
// not privileged, so a ganesha compromise gets no host device nor every
// capability. It mounts its volume's device, which kubelet alone puts in
// the container (volumeDevices, with its device cgroup rule), and checks,
// formats and grows it: SYS_ADMIN. Ganesha's VFS layer opens files by
// handle: DAC_READ_SEARCH. Not SYS_RESOURCE: a runtime whose bounding set
// lacks it fails the pod ("unable to apply caps"), and without it an ext4
// share grows by a new stage instead of in place (errGrowAtStage). The
// runtime's default AppArmor profile forbids mount, so none is applied;
// seccomp stays the runtime's default, which allows mount with SYS_ADMIN.
func shareManagerSecurity() *corev1.SecurityContext {
	return &corev1.SecurityContext{
		Privileged:               ptr.To(false),
		AllowPrivilegeEscalation: ptr.To(false),
		Capabilities: &corev1.Capabilities{
			Add:  []corev1.Capability{"SYS_ADMIN", "DAC_READ_SEARCH"},
			Drop: []corev1.Capability{"NET_RAW"},
		},
		AppArmorProfile: &corev1.AppArmorProfile{Type: corev1.AppArmorProfileTypeUnconfined},
		SeccompProfile:  &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
	}
}
