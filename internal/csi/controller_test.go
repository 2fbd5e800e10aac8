package csi

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	v1 "github.com/berth-io/berth/api/v1alpha1"
	"github.com/berth-io/berth/internal/mount"
)

func TestRequestedSize(t *testing.T) {
	for _, tc := range []struct {
		req, limit, want int64
		err              string
	}{
		{0, 0, defaultVolumeSize, ""},
		{1, 0, sizeAlign, ""},
		{sizeAlign + 1, 0, 2 * sizeAlign, ""},
		{0, 10 << 20, 10 << 20, ""},
		{5<<20 + 1, 5<<20 + 100, 5<<20 + 100, ""},
		{10 << 20, 5 << 20, 0, "exceed limit"},
		{-1, 0, 0, "negative"},
	} {
		got, err := requestedSize(&csi.CapacityRange{RequiredBytes: tc.req, LimitBytes: tc.limit})
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("requestedSize(%d, %d) err = %v, want %q", tc.req, tc.limit, err, tc.err)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("requestedSize(%d, %d) = %d, %v; want %d", tc.req, tc.limit, got, err, tc.want)
		}
	}
}

func TestParseParameters(t *testing.T) {
	m, fs, err := parseParameters(map[string]string{"mounter": "userspace", ParamFSType: "xfs", "csi.storage.k8s.io/pvc/name": "x", ParamRootSquash: "true"})
	if err != nil || m != v1.MounterUserspace || fs != "xfs" {
		t.Errorf("got %v %q %v", m, fs, err)
	}
	for _, bad := range []map[string]string{{"mounter": "fuse"}, {ParamFSType: "ntfs"}, {"color": "blue"}, {ParamRootSquash: "yes"}} {
		if _, _, err := parseParameters(bad); err == nil {
			t.Errorf("parseParameters(%v) accepted", bad)
		}
	}
}

func capability(mode csi.VolumeCapability_AccessMode_Mode, block bool, fs string) *csi.VolumeCapability {
	c := &csi.VolumeCapability{AccessMode: &csi.VolumeCapability_AccessMode{Mode: mode}}
	if block {
		c.AccessType = &csi.VolumeCapability_Block{Block: &csi.VolumeCapability_BlockVolume{}}
	} else {
		c.AccessType = &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{FsType: fs}}
	}
	return c
}

func TestCheckCapabilities(t *testing.T) {
	mode, vm, fs, err := checkCapabilities([]*csi.VolumeCapability{capability(csi.VolumeCapability_AccessMode_SINGLE_NODE_SINGLE_WRITER, false, "xfs")})
	if err != nil || mode != v1.ReadWriteOncePod || vm != v1.VolumeModeFilesystem || fs != "xfs" {
		t.Errorf("got %v %v %q %v", mode, vm, fs, err)
	}
	for name, caps := range map[string][]*csi.VolumeCapability{
		"none":         nil,
		"unknown mode": {capability(csi.VolumeCapability_AccessMode_UNKNOWN, false, "")},
		"no type":      {{AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER}}},
		"bad fs":       {capability(csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER, false, "zfs")},
		"mixed": {capability(csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER, false, ""),
			capability(csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER, true, "")},
	} {
		if _, _, _, err := checkCapabilities(caps); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

func TestObjectName(t *testing.T) {
	if got := objectName("vol", "pvc-0b5e7c2a-1111-2222-3333-444455556666"); got != "pvc-0b5e7c2a-1111-2222-3333-444455556666" {
		t.Errorf("a Kubernetes name changed: %s", got)
	}
	a, b := objectName("vol", "Sanity-ABC"), objectName("vol", "Sanity-ABC")
	if a != b || !validID(a) || !strings.HasPrefix(a, "vol-") {
		t.Errorf("derived name %q / %q not stable or not valid", a, b)
	}
	if objectName("vol", "Sanity-ABD") == a {
		t.Error("two names map to one object")
	}
}

func TestPage(t *testing.T) {
	start, end, next, err := page(5, "", 2)
	if err != nil || start != 0 || end != 2 || next != "2" {
		t.Errorf("first page: %d %d %q %v", start, end, next, err)
	}
	start, end, next, err = page(5, "4", 2)
	if err != nil || start != 4 || end != 5 || next != "" {
		t.Errorf("last page: %d %d %q %v", start, end, next, err)
	}
	if _, _, _, err := page(5, "x", 0); status.Code(err) != codes.Aborted {
		t.Errorf("bad token: %v, want Aborted", err)
	}
}

// ReadWriteOncePod reaches berth as SINGLE_NODE_SINGLE_WRITER only when the
// controller advertises SINGLE_NODE_MULTI_WRITER; both new modes must map.
func TestSingleNodeMultiWriterCapability(t *testing.T) {
	resp, err := (&Controller{}).ControllerGetCapabilities(context.Background(), &csi.ControllerGetCapabilitiesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, c := range resp.GetCapabilities() {
		if c.GetRpc().GetType() == csi.ControllerServiceCapability_RPC_SINGLE_NODE_MULTI_WRITER {
			found = true
		}
	}
	if !found {
		t.Error("controller does not advertise SINGLE_NODE_MULTI_WRITER")
	}
	for m, want := range map[csi.VolumeCapability_AccessMode_Mode]v1.AccessMode{
		csi.VolumeCapability_AccessMode_SINGLE_NODE_SINGLE_WRITER: v1.ReadWriteOncePod,
		csi.VolumeCapability_AccessMode_SINGLE_NODE_MULTI_WRITER:  v1.ReadWriteOnce,
	} {
		if got, err := accessMode(m); err != nil || got != want {
			t.Errorf("accessMode(%v) = %v, %v; want %v", m, got, err, want)
		}
	}
}

// A device held open is a precondition kubelet retries, not an internal error.
func TestHeldOpenIsFailedPrecondition(t *testing.T) {
	err := toStatus(fmt.Errorf("unstage /s: %w", &mount.HeldOpenError{Device: "/dev/loop3", Holders: []mount.Holder{{PID: 7, Command: "dd"}}}))
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "pid 7 (dd)") {
		t.Errorf("toStatus: %v", err)
	}
}
