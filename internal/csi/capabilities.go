package csi

import (
	"fmt"

	"github.com/container-storage-interface/spec/lib/go/csi"

	v1 "github.com/berth-io/berth/api/v1alpha1"
)

// accessMode maps a CSI access mode to the Kubernetes mode berth fences with.
func accessMode(m csi.VolumeCapability_AccessMode_Mode) (v1.AccessMode, error) {
	switch m {
	case csi.VolumeCapability_AccessMode_SINGLE_NODE_SINGLE_WRITER:
		return v1.ReadWriteOncePod, nil
	case csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER,
		csi.VolumeCapability_AccessMode_SINGLE_NODE_MULTI_WRITER,
		csi.VolumeCapability_AccessMode_SINGLE_NODE_READER_ONLY:
		return v1.ReadWriteOnce, nil
	case csi.VolumeCapability_AccessMode_MULTI_NODE_READER_ONLY:
		return v1.ReadOnlyMany, nil
	case csi.VolumeCapability_AccessMode_MULTI_NODE_MULTI_WRITER:
		return v1.ReadWriteMany, nil
	default:
		return "", fmt.Errorf("access mode %v is not supported", m)
	}
}

// checkCapabilities validates capabilities and returns the access mode,
// volume mode and fs type they ask for. They must agree with each other.
func checkCapabilities(caps []*csi.VolumeCapability) (v1.AccessMode, v1.VolumeMode, string, error) {
	if len(caps) == 0 {
		return "", "", "", fmt.Errorf("volume capabilities missing")
	}
	var (
		mode    v1.AccessMode
		volMode v1.VolumeMode
		fsType  string
	)
	for i, c := range caps {
		if c == nil || c.GetAccessMode() == nil {
			return "", "", "", fmt.Errorf("volume capability %d: access mode missing", i)
		}
		m, err := accessMode(c.GetAccessMode().GetMode())
		if err != nil {
			return "", "", "", fmt.Errorf("volume capability %d: %w", i, err)
		}
		var vm v1.VolumeMode
		switch {
		case c.GetBlock() != nil:
			vm = v1.VolumeModeBlock
		case c.GetMount() != nil:
			vm = v1.VolumeModeFilesystem
			fs := c.GetMount().GetFsType()
			if err := checkFSType(fs); err != nil {
				return "", "", "", fmt.Errorf("volume capability %d: %w", i, err)
			}
			if fs != "" {
				fsType = fs
			}
		default:
			return "", "", "", fmt.Errorf("volume capability %d: access type (mount or block) missing", i)
		}
		if i == 0 {
			mode, volMode = m, vm
		} else if vm != volMode {
			return "", "", "", fmt.Errorf("volume capabilities mix block and mount access")
		}
	}
	return mode, volMode, fsType, nil
}

func checkFSType(fs string) error {
	switch fs {
	case "", "ext4", "xfs":
		return nil
	}
	return fmt.Errorf("fs type %q is not supported (ext4, xfs)", fs)
}

// capabilitiesFit reports whether a volume made as vol can serve caps.
func capabilitiesFit(vol *v1.Volume, caps []*csi.VolumeCapability) error {
	_, volMode, fsType, err := checkCapabilities(caps)
	if err != nil {
		return err
	}
	if volMode != vol.Spec.VolumeMode {
		return fmt.Errorf("volume is %s, capabilities ask for %s", vol.Spec.VolumeMode, volMode)
	}
	if fsType != "" && vol.Spec.FSType != "" && fsType != vol.Spec.FSType {
		return fmt.Errorf("volume has fs type %s, capabilities ask for %s", vol.Spec.FSType, fsType)
	}
	for _, c := range caps {
		if m := c.GetAccessMode().GetMode(); !accessFits(vol.Spec.AccessMode, m) {
			return fmt.Errorf("volume is %s, capabilities ask for %v", vol.Spec.AccessMode, m)
		}
	}
	return nil
}

// accessFits tells whether a volume fenced as have serves a CSI access mode:
// the same mode or a narrower one; ReadWriteMany serves every mode.
func accessFits(have v1.AccessMode, asked csi.VolumeCapability_AccessMode_Mode) bool {
	want, err := accessMode(asked)
	switch {
	case err != nil:
		return false
	case want == have, have == v1.ReadWriteMany:
		return true
	case have == v1.ReadWriteOnce:
		return want == v1.ReadWriteOncePod
	case have == v1.ReadOnlyMany:
		return asked == csi.VolumeCapability_AccessMode_SINGLE_NODE_READER_ONLY
	}
	return false
}
