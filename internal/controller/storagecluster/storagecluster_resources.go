package storagecluster

import (
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
	keeperResources = noCPULimit("20m", "16Mi", "256Mi")
	// controllerResources are the CSI controller sidecars', and berth's
	// container's when no cluster sets spec.csiController.resources.
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

// resourceNames are what spec.agent.resources and
// spec.csiController.resources may set (the CRD refuses others).
var resourceNames = []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory}

// agentResources merges what the served clusters ask of the one agent
// that serves them all (mergeResources).
func agentResources(clusters []*v1.StorageCluster) corev1.ResourceRequirements {
	return clustersAsk(clusters, defaultAgentResources(), func(sc *v1.StorageCluster) (corev1.ResourceList, corev1.ResourceList) {
		if r := sc.Spec.Agent.Resources; r != nil {
			return r.Requests, r.Limits
		}
		return nil, nil
	})
}

// csiControllerResources merges what the served clusters ask of berth's
// container in the one CSI controller (mergeResources); the defaults are
// controllerResources, which the sidecars always get.
func csiControllerResources(clusters []*v1.StorageCluster) corev1.ResourceRequirements {
	return clustersAsk(clusters, controllerResources, func(sc *v1.StorageCluster) (corev1.ResourceList, corev1.ResourceList) {
		if r := sc.Spec.CSIController.Resources; r != nil {
			return r.Requests, r.Limits
		}
		return nil, nil
	})
}

// clustersAsk merges the asks of clusters (askOf their requests and
// limits, as of reads); no cluster asks def.
func clustersAsk(clusters []*v1.StorageCluster, def corev1.ResourceRequirements,
	of func(*v1.StorageCluster) (requests, limits corev1.ResourceList)) corev1.ResourceRequirements {
	asks := []corev1.ResourceRequirements{def}
	if len(clusters) > 0 {
		asks = asks[:0]
		for _, sc := range clusters {
			req, lim := of(sc)
			asks = append(asks, askOf(req, lim, def))
		}
	}
	return mergeResources(asks)
}

// askOf is what one cluster asks of a container: def when it sets
// nothing, else its own requests and limits, read as a pod's are (a limit
// without a request requests the limit; a zero limit is none).
func askOf(requests, limits corev1.ResourceList, def corev1.ResourceRequirements) corev1.ResourceRequirements {
	if len(requests) == 0 && len(limits) == 0 {
		return def
	}
	ask := corev1.ResourceRequirements{Requests: corev1.ResourceList{}, Limits: corev1.ResourceList{}}
	for _, name := range resourceNames {
		lim, limited := limits[name]
		limited = limited && lim.Sign() > 0
		if limited {
			ask.Limits[name] = lim.DeepCopy()
		}
		if req, ok := requests[name]; ok && req.Sign() > 0 {
			ask.Requests[name] = req.DeepCopy()
		} else if !ok && limited {
			ask.Requests[name] = lim.DeepCopy()
		}
	}
	return ask
}

// mergeResources merges what clusters ask of one container that serves
// them all: per resource, the largest request, and the largest limit, or
// none when any ask sets none. A limit is never below the request, which
// the API server would refuse for the whole workload. asks is not empty.
func mergeResources(asks []corev1.ResourceRequirements) corev1.ResourceRequirements {
	out := corev1.ResourceRequirements{Requests: corev1.ResourceList{}, Limits: corev1.ResourceList{}}
	for _, name := range resourceNames {
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

// resourcesChanged renders a workload with render and tells whether the
// first container of its pod template tmpl changed resources:
// createOrUpdate does not see a request or limit that was removed (a CPU
// limit taken out), so it must be told.
func resourcesChanged(tmpl *corev1.PodTemplateSpec, render func()) bool {
	was := containerResources(tmpl)
	render()
	return !equality.Semantic.DeepEqual(was, containerResources(tmpl))
}

func containerResources(tmpl *corev1.PodTemplateSpec) corev1.ResourceRequirements {
	if cs := tmpl.Spec.Containers; len(cs) > 0 {
		return *cs[0].Resources.DeepCopy()
	}
	return corev1.ResourceRequirements{}
}
