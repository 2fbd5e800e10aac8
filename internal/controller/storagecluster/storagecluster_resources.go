package storagecluster

import (
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	v1 "github.com/berth-io/berth/api/v1alpha1"
)

// nonRootUID runs the CSI controller pod (the distroless "nonroot" user).
const nonRootUID int64 = 65532

// Requests and limits of berth's pods. The keeper holds every FUSE
// connection of the node; killing it drops them all, so its memory limit
// leaves wide room over what it uses (a few MiB). It answers the healer
// for every userspace volume at once after an agent restart, while the
// volumes' I/O waits: no CPU limit to throttle that burst.
var (
	keeperResources = corev1.ResourceRequirements{
		Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("20m"), corev1.ResourceMemory: resource.MustParse("16Mi")},
		Limits:   corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("256Mi")},
	}
	controllerResources = resources("10m", "32Mi", "500m", "256Mi")
)

// defaultAgentResources are the agent's when no cluster sets
// spec.agent.resources. The userspace volumes' blockdev servers and the
// mkfs, fsck and resize tools run in its container, so it is the node's
// userspace data path: its CPU request is its weight against the
// workloads when the node is busy, and it has no CPU limit, whose
// throttling would stall every userspace volume's I/O at once. An OOM kill
// there stalls volume I/O too: the memory limit holds about a hundred Ceph
// volumes' servers (see AgentSpec.Resources).
func defaultAgentResources() corev1.ResourceRequirements {
	return corev1.ResourceRequirements{
		Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("100m"), corev1.ResourceMemory: resource.MustParse("128Mi")},
		Limits:   corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("2Gi")},
	}
}

func resources(cpuReq, memReq, cpuLim, memLim string) corev1.ResourceRequirements {
	return corev1.ResourceRequirements{
		Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse(cpuReq), corev1.ResourceMemory: resource.MustParse(memReq)},
		Limits:   corev1.ResourceList{corev1.ResourceCPU: resource.MustParse(cpuLim), corev1.ResourceMemory: resource.MustParse(memLim)},
	}
}

// agentResources merges what the clusters ask of the one agent that
// serves them all (defaults for a cluster that asks nothing): per
// resource, the largest request, and the largest limit, or none when any
// cluster sets none for it. A limit is never below the request, which the
// API server would refuse for the whole DaemonSet.
func agentResources(clusters []*v1.StorageCluster) corev1.ResourceRequirements {
	asked := make([]corev1.ResourceRequirements, 0, len(clusters))
	for _, sc := range clusters {
		if r := sc.Spec.Agent.Resources; r != nil {
			asked = append(asked, *r)
		} else {
			asked = append(asked, defaultAgentResources())
		}
	}
	if len(asked) == 0 {
		return defaultAgentResources()
	}
	out := corev1.ResourceRequirements{Requests: corev1.ResourceList{}, Limits: corev1.ResourceList{}}
	for _, r := range asked {
		for name, q := range r.Requests {
			if cur, ok := out.Requests[name]; !ok || q.Cmp(cur) > 0 {
				out.Requests[name] = q.DeepCopy()
			}
		}
	}
	unlimited := map[corev1.ResourceName]bool{}
	limited := unionKeys(asked)
	for _, r := range asked {
		for name := range limited {
			q, ok := r.Limits[name]
			if !ok {
				unlimited[name] = true
				continue
			}
			if cur, had := out.Limits[name]; !had || q.Cmp(cur) > 0 {
				out.Limits[name] = q.DeepCopy()
			}
		}
	}
	for name := range unlimited {
		delete(out.Limits, name)
	}
	for name, lim := range out.Limits {
		if req, ok := out.Requests[name]; ok && lim.Cmp(req) < 0 {
			out.Limits[name] = req.DeepCopy()
		}
	}
	if len(out.Requests) == 0 {
		out.Requests = nil
	}
	if len(out.Limits) == 0 {
		out.Limits = nil
	}
	return out
}

// unionKeys is every resource any of rs limits.
func unionKeys(rs []corev1.ResourceRequirements) map[corev1.ResourceName]bool {
	keys := map[corev1.ResourceName]bool{}
	for _, r := range rs {
		for name := range r.Limits {
			keys[name] = true
		}
	}
	return keys
}
