package agent

import (
	"context"
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/berth-io/berth/api/v1alpha1"
	"github.com/berth-io/berth/internal/flexvolume"
)

// +kubebuilder:rbac:groups="",resources=persistentvolumes,verbs=get

// flexDriver is the name a PersistentVolume's flexVolume source gives berth.
const flexDriver = flexvolume.Vendor + "/" + flexvolume.Name

// checkFlexOwner refuses a Flexvolume mount of a Volume that the pod's
// namespace does not own. Volumes are cluster-scoped and an inline
// flexVolume may name any of them, so the owner is looked up: the
// namespace of the claim bound to the Volume's CSI PersistentVolume, or to
// the Flexvolume PersistentVolume kubelet mounts (whose `volume` option an
// administrator wrote), or the Volume's berth.io/namespace label.
func (a *Agent) checkFlexOwner(ctx context.Context, r flexvolume.MountRequest) error {
	vol, err := a.volume(ctx, r.Volume)
	if err != nil {
		return err
	}
	owners, err := a.flexOwners(ctx, vol, r.PVOrVolumeName)
	if err != nil {
		return err
	}
	if r.PodNamespace != "" && slices.Contains(owners, r.PodNamespace) {
		return nil
	}
	owned := "no namespace owns it (no bound PersistentVolume, no " + v1.NamespaceLabel + " label)"
	if len(owners) > 0 {
		owned = "it belongs to namespace " + strings.Join(owners, ", ")
	}
	return fmt.Errorf("pod namespace %q may not use volume %s: %s: %w", r.PodNamespace, r.Volume, owned, ErrNotOwned)
}

// flexOwners lists the namespaces that own vol.
func (a *Agent) flexOwners(ctx context.Context, vol *v1.Volume, kubeletName string) ([]string, error) {
	var owners []string
	if ns := vol.Labels[v1.NamespaceLabel]; ns != "" {
		owners = append(owners, ns)
	}
	// The CSI provisioner's PV carries the name Kubernetes asked for.
	csiPV := vol.Annotations[v1.CSINameAnnotation]
	if csiPV == "" {
		csiPV = vol.Name
	}
	pv, err := a.pv(ctx, csiPV)
	if err != nil {
		return nil, err
	}
	if pv != nil && pv.Spec.CSI != nil && pv.Spec.CSI.Driver == v1.DriverName && pv.Spec.CSI.VolumeHandle == vol.Name && boundClaim(pv) {
		owners = append(owners, pv.Spec.ClaimRef.Namespace)
	}
	if kubeletName == "" || kubeletName == csiPV {
		return owners, nil
	}
	if pv, err = a.pv(ctx, kubeletName); err != nil {
		return nil, err
	}
	if pv != nil && pv.Spec.FlexVolume != nil && pv.Spec.FlexVolume.Driver == flexDriver && boundClaim(pv) {
		if flexTarget(pv.Spec.FlexVolume.Options, pv.Name) == vol.Name {
			owners = append(owners, pv.Spec.ClaimRef.Namespace)
		}
	}
	return owners, nil
}

// boundClaim tells whether pv is bound to a claim, whose namespace then
// owns it. A Released PV (its claim deleted, kept by a Retain policy) keeps
// its claimRef, but the namespace no longer has it (F24).
func boundClaim(pv *corev1.PersistentVolume) bool {
	return pv.Spec.ClaimRef != nil && pv.Spec.ClaimRef.Namespace != "" && pv.Status.Phase == corev1.VolumeBound
}

// pv reads a PersistentVolume; nil when there is none of that name.
func (a *Agent) pv(ctx context.Context, name string) (*corev1.PersistentVolume, error) {
	pv := &corev1.PersistentVolume{}
	if err := a.api.Get(ctx, client.ObjectKey{Name: name}, pv); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, nil
		}
		return nil, fmt.Errorf("read PersistentVolume %s: %w", name, err)
	}
	return pv, nil
}
