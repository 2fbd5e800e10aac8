package csi

import (
	"testing"

	v1 "github.com/berth-io/berth/api/v1alpha1"
)

// TestSharedVolumeHasNoNodeTopology: a local read-write-many filesystem
// volume's pods mount its share over NFS from any node, so its PV must not
// pin them to the image's node (the VM scenario's writers on another node
// stayed Pending on the PV's node affinity); block and RWO volumes keep it.
func TestSharedVolumeHasNoNodeTopology(t *testing.T) {
	for _, tc := range []struct {
		access v1.AccessMode
		mode   v1.VolumeMode
		pinned bool
	}{
		{v1.ReadWriteMany, "", false},
		{v1.ReadWriteMany, v1.VolumeModeFilesystem, false},
		{v1.ReadWriteMany, v1.VolumeModeBlock, true},
		{v1.ReadWriteOnce, v1.VolumeModeFilesystem, true},
	} {
		v := &v1.Volume{Spec: v1.VolumeSpec{Node: "n1", AccessMode: tc.access, VolumeMode: tc.mode}}
		out := csiVolume(v, nil)
		if pinned := len(out.GetAccessibleTopology()) > 0; pinned != tc.pinned {
			t.Errorf("%s %q: topology %v, want pinned %t", tc.access, tc.mode, out.GetAccessibleTopology(), tc.pinned)
		}
		if out.GetVolumeContext()["node"] != "n1" {
			t.Errorf("%s %q: volume context %v lacks the node", tc.access, tc.mode, out.GetVolumeContext())
		}
	}
}
