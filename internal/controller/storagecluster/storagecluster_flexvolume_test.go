package storagecluster_test

import (
	"context"
	"fmt"
	"slices"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/berth-io/berth/api/v1alpha1"
)

// TestAgentFlexvolumeFollowsClusters: the agent names kubelet's plugin
// folder (installing the driver) while any cluster wants Flexvolume; when
// every cluster turns it off, it names none. It never mounts the folder
// (a hostPath kubelet cannot make on a read-only /usr would keep the
// agent pod from starting). With no cluster left, the agent keeps what it
// had: a deleted cluster's volumes are cleaned by it.
func TestAgentFlexvolumeFollowsClusters(t *testing.T) {
	suite.Require(t)
	agent := daemonSet("berth-agent")
	flex := func(what string, on bool) {
		t.Helper()
		eventually(t, what, func(ctx context.Context) (bool, error) {
			if err := env.Client.Get(ctx, client.ObjectKeyFromObject(agent), agent); err != nil {
				return false, client.IgnoreNotFound(err)
			}
			p := agent.Spec.Template.Spec
			arg := "--volume-plugin-dir="
			if on {
				arg += opts.VolumePluginDir
			}
			mounted := slices.ContainsFunc(p.Containers[0].VolumeMounts, func(m corev1.VolumeMount) bool { return m.Name == "volume-plugin-dir" })
			volume := slices.ContainsFunc(p.Volumes, func(v corev1.Volume) bool {
				return v.Name == "volume-plugin-dir" || (v.HostPath != nil && v.HostPath.Path == opts.VolumePluginDir)
			})
			if mounted || volume {
				return false, fmt.Errorf("the agent mounts the plugin folder: %v", p.Volumes)
			}
			return slices.Contains(p.Containers[0].Args, arg), nil
		})
	}
	off := v1.AgentSpec{Flexvolume: v1.FlexvolumeSpec{Enabled: ptr.To(false)}}
	a := newCluster(t, "flex-a", v1.StorageClusterSpec{DataDir: "/srv/flex-a", Agent: off})
	flex("Flexvolume off with the only cluster", false)
	checkAgentMounts(t, agent)

	b := newCluster(t, "flex-b", v1.StorageClusterSpec{DataDir: "/srv/flex-b"})
	flex("Flexvolume on while a cluster wants it (the default)", true)
	updateCluster(t, b, func(s *v1.StorageClusterSpec) { s.Agent = off })
	flex("Flexvolume off when every cluster turns it off", false)

	removeCluster(t, a.Name)
	removeCluster(t, b.Name)
	gone(t, b)
	eventually(t, "the agent serves no cluster", func(ctx context.Context) (bool, error) {
		err := env.Client.Get(ctx, client.ObjectKeyFromObject(agent), agent)
		return err == nil && !slices.Contains(agent.Spec.Template.Spec.Containers[0].Args, "--data-dir=/srv/flex-b"), err
	})
	flex("no cluster left: Flexvolume stays off", false)

	newCluster(t, "flex-c", v1.StorageClusterSpec{DataDir: "/srv/flex-c"})
	flex("a new cluster wants Flexvolume", true)
}

// checkAgentMounts: every mount of the agent container names a volume of
// its pod, and every volume is mounted.
func checkAgentMounts(t *testing.T, ds *appsv1.DaemonSet) {
	t.Helper()
	p := ds.Spec.Template.Spec
	var vols []string
	for _, v := range p.Volumes {
		vols = append(vols, v.Name)
	}
	var mounts []string
	for _, m := range p.Containers[0].VolumeMounts {
		mounts = append(mounts, m.Name)
	}
	slices.Sort(vols)
	slices.Sort(mounts)
	if !slices.Equal(vols, mounts) {
		t.Errorf("agent volumes %v, mounts %v", vols, mounts)
	}
}
