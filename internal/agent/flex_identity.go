package agent

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/berth-io/berth/internal/flexvolume"
	"github.com/berth-io/berth/internal/nodepath"
)

// +kubebuilder:rbac:groups="",resources=pods,verbs=get

// flexPod finds the pod a Flexvolume mount is for. Only the mount dir is
// kubelet's own (pods/<uid>/volumes/<plugin>/<name>): the options may have
// been written by anyone who could write a pod spec, a static pod or a PV.
// So the pod is the one of the mount dir's UID, bound to this node, whose
// spec names this volume; every identity option must agree with it.
func (a *Agent) flexPod(ctx context.Context, r flexvolume.MountRequest, dir nodepath.PodVolume) (*corev1.Pod, error) {
	refuse := func(format string, args ...any) error {
		return fmt.Errorf("flexvolume mount at %s: %s: %w", r.MountDir, fmt.Sprintf(format, args...), ErrIdentity)
	}
	if r.PodUID != "" && r.PodUID != dir.PodUID {
		return nil, refuse("option %s=%q disagrees with the mount dir's pod %s", flexvolume.OptPodUID, r.PodUID, dir.PodUID)
	}
	if r.PVOrVolumeName != "" && r.PVOrVolumeName != dir.Name {
		return nil, refuse("option %s=%q disagrees with the mount dir's volume %s", flexvolume.OptVolumeName, r.PVOrVolumeName, dir.Name)
	}
	if r.PodNamespace == "" || r.PodName == "" {
		return nil, refuse("options %s and %s must name the pod", flexvolume.OptPodNamespace, flexvolume.OptPodName)
	}
	// A GET by the named pod (no list of every pod): a wrong name or
	// namespace finds another UID, or none, and is refused.
	pod := &corev1.Pod{}
	if err := a.api.Get(ctx, client.ObjectKey{Namespace: r.PodNamespace, Name: r.PodName}, pod); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, refuse("no pod %s/%s (options %s, %s)", r.PodNamespace, r.PodName, flexvolume.OptPodNamespace, flexvolume.OptPodName)
		}
		return nil, fmt.Errorf("read pod %s/%s: %w", r.PodNamespace, r.PodName, err)
	}
	switch {
	case string(pod.UID) != dir.PodUID:
		return nil, refuse("pod %s/%s named by the options has UID %s, the mount dir belongs to pod %s", pod.Namespace, pod.Name, pod.UID, dir.PodUID)
	case pod.Spec.NodeName != a.node:
		return nil, refuse("pod %s/%s is bound to node %q, this is %s", pod.Namespace, pod.Name, pod.Spec.NodeName, a.node)
	case r.ServiceAccount != "" && r.ServiceAccount != pod.Spec.ServiceAccountName:
		return nil, refuse("option %s=%q disagrees with pod %s/%s's service account %q", flexvolume.OptServiceAccount, r.ServiceAccount, pod.Namespace, pod.Name, pod.Spec.ServiceAccountName)
	}
	ok, err := a.podNamesFlexVolume(ctx, pod, dir.Name, r.Volume)
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, refuse("pod %s/%s has no %s volume %s naming volume %s (inline, or through a claim bound to that PersistentVolume)",
			pod.Namespace, pod.Name, flexDriver, dir.Name, r.Volume)
	}
	return pod, nil
}

// podNamesFlexVolume tells whether the pod's spec mounts volume through
// berth's Flexvolume driver under kubelet's name name: an inline
// flexVolume of that name, or a claim bound to the Flexvolume
// PersistentVolume of that name.
func (a *Agent) podNamesFlexVolume(ctx context.Context, pod *corev1.Pod, name, volume string) (bool, error) {
	claims := map[string]bool{}
	for _, v := range pod.Spec.Volumes {
		if fv := v.FlexVolume; fv != nil && v.Name == name && fv.Driver == flexDriver && flexTarget(fv.Options, v.Name) == volume {
			return true, nil
		}
		if v.PersistentVolumeClaim != nil {
			claims[v.PersistentVolumeClaim.ClaimName] = true
		}
	}
	if len(claims) == 0 {
		return false, nil
	}
	pv, err := a.pv(ctx, name)
	if err != nil || pv == nil {
		return false, err
	}
	fv, ref := pv.Spec.FlexVolume, pv.Spec.ClaimRef
	return fv != nil && fv.Driver == flexDriver && flexTarget(fv.Options, pv.Name) == volume &&
		ref != nil && ref.Namespace == pod.Namespace && claims[ref.Name], nil
}

// flexTarget is the Volume a Flexvolume source mounts: its `volume`
// option, else the name kubelet mounts it by.
func flexTarget(options map[string]string, name string) string {
	if t := options[flexvolume.OptVolume]; t != "" {
		return t
	}
	return name
}
