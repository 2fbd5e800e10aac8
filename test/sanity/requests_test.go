package sanity

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/moby/sys/mountinfo"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/berth-io/berth/api/v1alpha1"
	"github.com/berth-io/berth/internal/testenv"
)

type clients struct {
	ctrl csi.ControllerClient
	node csi.NodeClient
}

func dial(t *testing.T) clients {
	t.Helper()
	skipUnlessDriver(t)
	return clients{ctrl: csi.NewControllerClient(conn(t, drv.ctrlSock)), node: csi.NewNodeClient(conn(t, drv.nodeSock))}
}

// conn is a client connection to the Unix socket sock, closed when t ends.
func conn(t *testing.T, sock string) *grpc.ClientConn {
	t.Helper()
	c, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func testCtx(t *testing.T) context.Context {
	return testenv.Context(t, 60*time.Second)
}

func mountCap() *csi.VolumeCapability {
	return &csi.VolumeCapability{
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
		AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{FsType: "ext4"}},
	}
}

func blockCap() *csi.VolumeCapability {
	return &csi.VolumeCapability{
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
		AccessType: &csi.VolumeCapability_Block{Block: &csi.VolumeCapability_BlockVolume{}},
	}
}

func wantCode(t *testing.T, what string, err error, code codes.Code) {
	t.Helper()
	if status.Code(err) != code {
		t.Errorf("%s: got %v, want %s", what, err, code)
	}
}

// createVolume makes a volume and removes it when the test ends.
func createVolume(t *testing.T, c clients, name string, vc *csi.VolumeCapability) *csi.Volume {
	t.Helper()
	resp, err := c.ctrl.CreateVolume(testCtx(t), &csi.CreateVolumeRequest{
		Name: name, VolumeCapabilities: []*csi.VolumeCapability{vc}, Parameters: classParams(),
		CapacityRange: &csi.CapacityRange{RequiredBytes: 64 << 20},
	})
	if err != nil {
		t.Fatalf("create volume %s: %v", name, err)
	}
	t.Cleanup(func() {
		if _, err := c.ctrl.DeleteVolume(context.Background(), &csi.DeleteVolumeRequest{VolumeId: resp.GetVolume().GetVolumeId()}); err != nil {
			t.Errorf("delete volume: %v", err)
		}
	})
	return resp.GetVolume()
}

// TestBadRequests: each wrong request gets the code the CSI spec names and
// changes nothing.
func TestBadRequests(t *testing.T) {
	c := dial(t)
	ctx := testCtx(t)

	// Refused at placement: no agent reports that much free space.
	_, err := c.ctrl.CreateVolume(ctx, &csi.CreateVolumeRequest{
		Name: "too-big", VolumeCapabilities: []*csi.VolumeCapability{mountCap()}, Parameters: classParams(),
		CapacityRange: &csi.CapacityRange{RequiredBytes: 1 << 60},
	})
	wantCode(t, "size beyond capacity", err, codes.ResourceExhausted)
	if err := drv.env.Client.Get(ctx, client.ObjectKey{Name: "too-big"}, &v1.Volume{}); err == nil {
		t.Error("a refused CreateVolume left a Volume object")
	}

	unknown := mountCap()
	unknown.AccessMode.Mode = csi.VolumeCapability_AccessMode_UNKNOWN
	_, err = c.ctrl.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "unknown-cap", VolumeCapabilities: []*csi.VolumeCapability{unknown}})
	wantCode(t, "unknown access mode", err, codes.InvalidArgument)
	_, err = c.ctrl.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "no-cap"})
	wantCode(t, "no capability", err, codes.InvalidArgument)
	_, err = c.ctrl.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "bad-param", VolumeCapabilities: []*csi.VolumeCapability{mountCap()},
		Parameters: map[string]string{"mounter": "magic"}})
	wantCode(t, "unknown mounter", err, codes.InvalidArgument)

	_, err = c.node.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{StagingTargetPath: "/tmp/x", VolumeCapability: mountCap()})
	wantCode(t, "stage without volume ID", err, codes.InvalidArgument)
	unknownStaging, _ := kubeletDirs(t)
	_, err = c.node.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: "no-such-volume", StagingTargetPath: unknownStaging, VolumeCapability: mountCap()})
	wantCode(t, "stage of an unknown volume", err, codes.NotFound)
	_, err = c.node.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: "no-such-volume", StagingTargetPath: "/tmp/x", VolumeCapability: mountCap()})
	wantCode(t, "stage outside kubelet's folders", err, codes.InvalidArgument)

	// A filesystem volume published onto a file: refused, nothing mounted.
	vol := createVolume(t, c, "bad-target", mountCap())
	staging, mountDir := kubeletDirs(t)
	target := mountDir + "-file"
	if err := os.WriteFile(target, []byte("keep me"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := c.node.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: vol.VolumeId, StagingTargetPath: staging, VolumeCapability: mountCap()}); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if _, err := c.node.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: vol.VolumeId, StagingTargetPath: staging}); err != nil {
			t.Errorf("unstage: %v", err)
		}
	}()
	_, err = c.node.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: vol.VolumeId, StagingTargetPath: staging, TargetPath: target, VolumeCapability: mountCap()})
	wantCode(t, "publish onto a file", err, codes.InvalidArgument)
	if b, err := os.ReadFile(target); err != nil || string(b) != "keep me" {
		t.Errorf("target file changed: %q %v", b, err)
	}
	if n := mountsAt(t, target); n != 0 {
		t.Errorf("%d mounts at the refused target", n)
	}
	_, err = c.node.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: vol.VolumeId, StagingTargetPath: staging, TargetPath: mountDir, VolumeCapability: blockCap()})
	wantCode(t, "block publish of a filesystem volume", err, codes.InvalidArgument)
}

func mountsAt(t *testing.T, path string) int {
	t.Helper()
	ms, err := mountinfo.GetMounts(func(m *mountinfo.Info) (skip, stop bool) { return m.Mountpoint != path, false })
	if err != nil {
		t.Fatal(err)
	}
	return len(ms)
}

// TestStageRetryAfterCrash leaves what a node service killed after each step
// of NodeStage leaves (a loop device; plus a filesystem; plus the mount),
// then retries NodeStage twice: exactly one loop device and one mount result
// each time, and unstage removes both.
func TestStageRetryAfterCrash(t *testing.T) {
	c := dial(t)
	ctx := testCtx(t)
	for i, step := range []string{"attach", "format", "mount"} {
		t.Run("killed after "+step, func(t *testing.T) {
			vol := createVolume(t, c, "crash-"+step, mountCap())
			v := &v1.Volume{}
			if err := drv.env.Client.Get(ctx, client.ObjectKey{Name: vol.VolumeId}, v); err != nil {
				t.Fatal(err)
			}
			staging, _ := kubeletDirs(t)
			dev := testenv.Run(t, "losetup", "--find", "--show", "--direct-io=on", v.Status.Path)
			if i >= 1 {
				testenv.Run(t, "mkfs.ext4", "-q", "-F", dev)
			}
			if i >= 2 {
				if err := os.MkdirAll(staging, 0o750); err != nil {
					t.Fatal(err)
				}
				testenv.Run(t, "mount", "-t", "ext4", dev, staging)
			}
			for range 2 {
				if _, err := c.node.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: vol.VolumeId, StagingTargetPath: staging, VolumeCapability: mountCap()}); err != nil {
					t.Fatalf("stage retry: %v", err)
				}
				if loops := testenv.LoopsOf(t, v.Status.Path); len(loops) != 1 || loops[0] != dev {
					t.Errorf("loop devices of the image: %v, want [%s]", loops, dev)
				}
				if n := mountsAt(t, staging); n != 1 {
					t.Errorf("%d mounts at the staging path, want 1", n)
				}
			}
			if _, err := c.node.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: vol.VolumeId, StagingTargetPath: staging}); err != nil {
				t.Fatalf("unstage: %v", err)
			}
			if loops := testenv.LoopsOf(t, v.Status.Path); len(loops) != 0 || mountsAt(t, staging) != 0 {
				t.Errorf("after unstage: loops %v, mounts %d", loops, mountsAt(t, staging))
			}
		})
	}
}
