package storagecluster

import (
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

// nonRootUID runs the CSI controller pod (the distroless "nonroot" user).
const nonRootUID int64 = 65532

// Requests and limits of berth's pods. The agent's are generous: the
// userspace volumes' blockdev servers and the mkfs, fsck and resize tools it
// runs share its container, and an OOM kill there stalls volume I/O. The
// keeper holds every FUSE connection of the node; killing it drops them all,
// so its memory limit leaves wide room over what it uses (a few MiB).
var (
	agentResources      = resources("50m", "64Mi", "2", "2Gi")
	keeperResources     = resources("10m", "16Mi", "500m", "256Mi")
	controllerResources = resources("10m", "32Mi", "500m", "256Mi")
)

func resources(cpuReq, memReq, cpuLim, memLim string) corev1.ResourceRequirements {
	return corev1.ResourceRequirements{
		Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse(cpuReq), corev1.ResourceMemory: resource.MustParse(memReq)},
		Limits:   corev1.ResourceList{corev1.ResourceCPU: resource.MustParse(cpuLim), corev1.ResourceMemory: resource.MustParse(memLim)},
	}
}
