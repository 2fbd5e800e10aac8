package storagecluster

import (
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
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
	keeperResources     = noCPULimit("20m", "16Mi", "256Mi")
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
func defaultAgentResources() corev1.ResourceRequirements { return noCPULimit("100m", "128Mi", "2Gi") }

// noCPULimit requests CPU and memory and limits memory only.
func noCPULimit(cpuReq, memReq, memLim string) corev1.ResourceRequirements {
	r := resources(cpuReq, memReq, "0", memLim)
	delete(r.Limits, corev1.ResourceCPU)
	return r
}

func resources(cpuReq, memReq, cpuLim, memLim string) corev1.ResourceRequirements {
	return corev1.ResourceRequirements{
		Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse(cpuReq), corev1.ResourceMemory: resource.MustParse(memReq)},
		Limits:   corev1.ResourceList{corev1.ResourceCPU: resource.MustParse(cpuLim), corev1.ResourceMemory: resource.MustParse(memLim)},
	}
}

// agentResourceNames are what spec.agent.resources may set (the CRD
// refuses others).
var agentResourceNames = []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory}

// askOf is what one cluster asks of the agent: the defaults when it sets
// nothing, else its own, read as a pod's are (a limit without a request
// requests the limit; a zero limit is none).
func askOf(sc *v1.StorageCluster) corev1.ResourceRequirements {
	r := sc.Spec.Agent.Resources
	if r == nil || (len(r.Requests) == 0 && len(r.Limits) == 0) {
		return defaultAgentResources()
	}
	ask := corev1.ResourceRequirements{Requests: corev1.ResourceList{}, Limits: corev1.ResourceList{}}
	for _, name := range agentResourceNames {
		lim, limited := r.Limits[name]
		limited = limited && lim.Sign() > 0
		if limited {
			ask.Limits[name] = lim.DeepCopy()
		}
		if req, ok := r.Requests[name]; ok && req.Sign() > 0 {
			ask.Requests[name] = req.DeepCopy()
		} else if !ok && limited {
			ask.Requests[name] = lim.DeepCopy()
		}
	}
	return ask
}

// agentResources merges what the served clusters ask of the one agent
// that serves them all: per resource, the largest request, and the
// largest limit, or none when any cluster sets none. A limit is never
// below the request, which the API server would refuse for the whole
// DaemonSet.
func agentResources(clusters []*v1.StorageCluster) corev1.ResourceRequirements {
	asks := []corev1.ResourceRequirements{defaultAgentResources()}
	if len(clusters) > 0 {
		asks = asks[:0]
		for _, sc := range clusters {
			asks = append(asks, askOf(sc))
		}
	}
	out := corev1.ResourceRequirements{Requests: corev1.ResourceList{}, Limits: corev1.ResourceList{}}
	for _, name := range agentResourceNames {
		limited := true
		for _, a := range asks {
			if q, ok := a.Requests[name]; ok {
				if cur, had := out.Requests[name]; !had || q.Cmp(cur) > 0 {
					out.Requests[name] = q.DeepCopy()
				}
			}
			q, ok := a.Limits[name]
			if !ok {
				limited = false
				continue
			}
			if cur, had := out.Limits[name]; !had || q.Cmp(cur) > 0 {
				out.Limits[name] = q.DeepCopy()
			}
		}
		// asks is never empty: limited means every ask set a limit.
		if !limited {
			delete(out.Limits, name)
		} else if lim, req := out.Limits[name], out.Requests[name]; lim.Cmp(req) < 0 {
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

// resourcesChanged renders ds with render and tells whether its first
// container's resources changed: createOrUpdate does not see a request or
// limit that was removed (a CPU limit taken out), so it must be told.
func resourcesChanged(ds *appsv1.DaemonSet, render func()) bool {
	was := containerResources(ds)
	render()
	return !equality.Semantic.DeepEqual(was, containerResources(ds))
}

func containerResources(ds *appsv1.DaemonSet) corev1.ResourceRequirements {
	if cs := ds.Spec.Template.Spec.Containers; len(cs) > 0 {
		return *cs[0].Resources.DeepCopy()
	}
	return corev1.ResourceRequirements{}
}
