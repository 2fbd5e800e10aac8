package agent

import (
	"context"
	"errors"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	v1 "github.com/berth-io/berth/api/v1alpha1"
	"github.com/berth-io/berth/internal/mount"
)

// ReasonDeviceHeldOpen is the Warning Event reason when unstage is refused
// because a process on the node holds the volume's device open.
const ReasonDeviceHeldOpen = "DeviceHeldOpen"

// reportHeldOpen emits DeviceHeldOpen when err is a HeldOpenError: kubelet
// retries the unstage and shows only its own words, so an operator looking
// at the Volume or the PV learns here which process to look for.
func (a *Agent) reportHeldOpen(ctx context.Context, volumeID string, err error) {
	var held *mount.HeldOpenError
	if a.events == nil || !errors.As(err, &held) {
		return
	}
	msg := "unstage on node " + a.node + " waits: " + held.Error()
	vol := &v1.Volume{}
	if gerr := a.api.Get(ctx, types.NamespacedName{Name: volumeID}, vol); gerr == nil {
		a.events.Event(vol, corev1.EventTypeWarning, ReasonDeviceHeldOpen, msg)
	} else {
		a.log.V(1).Info("no Volume to tell that its device is held open", "volume", volumeID, "err", gerr.Error())
	}
	// berth names a volume after its CSI name, which the provisioner makes
	// the PV's name; the handle check keeps an unrelated PV out.
	pv := &corev1.PersistentVolume{}
	if gerr := a.api.Get(ctx, types.NamespacedName{Name: volumeID}, pv); gerr == nil &&
		pv.Spec.CSI != nil && pv.Spec.CSI.VolumeHandle == volumeID {
		a.events.Event(pv, corev1.EventTypeWarning, ReasonDeviceHeldOpen, msg)
	}
}
