package storagecluster

import (
	"slices"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
)

// TestAgentWithoutPluginDir: an operator without a plugin folder (chart
// value flexvolume.enabled=false) renders an agent that names none, also
// while a cluster asks for Flexvolume. With one or without, the agent
// mounts no plugin folder: it starts on nodes whose kubelet has no
// writable plugin folder, and reports the failed install there.
func TestAgentWithoutPluginDir(t *testing.T) {
	o := Options{Namespace: "berth-system", Image: "berth:test", ProvisionerImage: "p", ResizerImage: "r", SnapshotterImage: "s",
		KubeletDir: "/var/lib/kubelet", AgentServiceAccount: "a", ControllerServiceAccount: "c"}
	if err := o.Validate(); err != nil {
		t.Fatalf("options without a plugin folder: %v", err)
	}
	for _, dir := range []string{"", "/usr/libexec/kubernetes/kubelet-plugins/volume/exec"} {
		o.VolumePluginDir = dir
		r := &Reconciler{Options: o}
		ds := &appsv1.DaemonSet{}
		r.agentDaemonSet(nodeWidePlan{dirs: map[string]string{}, flexvolume: true}, ds)
		p := ds.Spec.Template.Spec
		if !slices.Contains(p.Containers[0].Args, "--volume-plugin-dir="+dir) {
			t.Errorf("plugin folder %q: agent args %v", dir, p.Containers[0].Args)
		}
		mounted := slices.ContainsFunc(p.Volumes, func(v corev1.Volume) bool { return v.Name == "volume-plugin-dir" })
		if mounted {
			t.Errorf("plugin folder %q: the agent mounts it: %t", dir, mounted)
		}
	}
}
