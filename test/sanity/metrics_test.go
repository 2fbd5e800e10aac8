package sanity

import (
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/berth-io/berth/internal/testenv"
)

// TestMetricsCountRealCalls: the agent's and the CSI controller's /metrics
// endpoints count real calls on a real volume (create, stage, publish,
// expand, unpublish, unstage, delete: loop device, mkfs, mounts, resize2fs) under the gRPC code
// they answered, refused calls under their error code, one latency
// observation per call; fencing counts the holds taken and released; the
// node gauge shows the volume; both health endpoints answer.
func TestMetricsCountRealCalls(t *testing.T) {
	c := dial(t)
	ctx := testCtx(t)
	agent0, ctrl0 := testenv.ScrapeAddr(t, drv.agentMetrics), testenv.ScrapeAddr(t, drv.ctrlMetrics)

	const name = "metrics-vol"
	created, err := c.ctrl.CreateVolume(ctx, &csi.CreateVolumeRequest{
		Name: name, VolumeCapabilities: []*csi.VolumeCapability{mountCap()}, Parameters: classParams(),
		CapacityRange: &csi.CapacityRange{RequiredBytes: 64 << 20},
	})
	if err != nil {
		t.Fatal(err)
	}
	id := created.GetVolume().GetVolumeId()
	staging, target := kubeletDirs(t)
	if _, err := c.node.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: id, StagingTargetPath: staging, VolumeCapability: mountCap()}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.node.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: id, StagingTargetPath: staging, TargetPath: target, VolumeCapability: mountCap()}); err != nil {
		t.Fatal(err)
	}
	grown := &csi.CapacityRange{RequiredBytes: 128 << 20}
	if _, err := c.ctrl.ControllerExpandVolume(ctx, &csi.ControllerExpandVolumeRequest{VolumeId: id, CapacityRange: grown, VolumeCapability: mountCap()}); err != nil {
		t.Fatal(err)
	}
	// Where the kernel refuses online growth of the mounted filesystem
	// (this machine: no CAP_SYS_RESOURCE), the agent answers
	// FailedPrecondition (it grows at the next stage); either way the call
	// is counted under the code it answered.
	_, err = c.node.NodeExpandVolume(ctx, &csi.NodeExpandVolumeRequest{VolumeId: id, VolumePath: target, StagingTargetPath: staging,
		CapacityRange: grown, VolumeCapability: mountCap()})
	expandCode := status.Code(err).String()
	if err != nil && status.Code(err) != codes.FailedPrecondition {
		t.Errorf("NodeExpandVolume: %v", err)
	}
	staged := testenv.ScrapeAddr(t, drv.agentMetrics)
	if n := staged[testenv.Series("berth_volumes", "state", "Available", "transport", "loop")]; n < 1 {
		t.Errorf("berth_volumes{state=Available,transport=loop} = %v with a staged volume, want >= 1", n)
	}
	if _, err := c.node.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: id, TargetPath: target}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.node.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: staging}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.ctrl.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: id}); err != nil {
		t.Fatal(err)
	}
	// Refused calls, counted under their codes.
	unknownStaging, _ := kubeletDirs(t)
	_, err = c.node.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: "no-such-volume", StagingTargetPath: unknownStaging, VolumeCapability: mountCap()})
	wantCode(t, "stage of an unknown volume", err, codes.NotFound)
	_, err = c.ctrl.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "metrics-no-cap"})
	wantCode(t, "create without a capability", err, codes.InvalidArgument)

	agent1, ctrl1 := testenv.ScrapeAddr(t, drv.agentMetrics), testenv.ScrapeAddr(t, drv.ctrlMetrics)
	req := func(op, code string) string {
		return testenv.Series("berth_csi_requests_total", "operation", op, "code", code)
	}
	took := func(op string) string {
		return testenv.Series("berth_csi_request_duration_seconds_count", "operation", op)
	}
	testenv.WantDelta(t, "agent", agent0, agent1, req("NodeExpandVolume", expandCode), 1)
	testenv.WantDelta(t, "agent", agent0, agent1, took("NodeExpandVolume"), 1)
	for _, op := range []string{"NodePublishVolume", "NodeUnpublishVolume", "NodeUnstageVolume"} {
		testenv.WantDelta(t, "agent", agent0, agent1, req(op, "OK"), 1)
		testenv.WantDelta(t, "agent", agent0, agent1, took(op), 1)
	}
	testenv.WantDelta(t, "agent", agent0, agent1, req("NodeStageVolume", "OK"), 1)
	testenv.WantDelta(t, "agent", agent0, agent1, req("NodeStageVolume", "NotFound"), 1)
	testenv.WantDelta(t, "agent", agent0, agent1, took("NodeStageVolume"), 2)
	// The stage record and the pod's hold, taken and released.
	testenv.WantDelta(t, "agent", agent0, agent1, testenv.Series("berth_fence_acquires_total", "result", "granted"), 2)
	testenv.WantDelta(t, "agent", agent0, agent1, testenv.Series("berth_fence_releases_total", "result", "ok"), 2)
	testenv.WantDelta(t, "agent", agent0, agent1, "berth_fence_acquire_duration_seconds_count", 2)

	testenv.WantDelta(t, "controller", ctrl0, ctrl1, req("CreateVolume", "OK"), 1)
	testenv.WantDelta(t, "controller", ctrl0, ctrl1, req("CreateVolume", "InvalidArgument"), 1)
	testenv.WantDelta(t, "controller", ctrl0, ctrl1, req("DeleteVolume", "OK"), 1)
	testenv.WantDelta(t, "controller", ctrl0, ctrl1, req("ControllerExpandVolume", "OK"), 1)
	testenv.WantDelta(t, "controller", ctrl0, ctrl1, took("ControllerExpandVolume"), 1)
	testenv.WantDelta(t, "controller", ctrl0, ctrl1, took("CreateVolume"), 2)
	if ctrl1[took("DeleteVolume")] < 1 || ctrl1[testenv.Series("berth_csi_request_duration_seconds_sum", "operation", "CreateVolume")] <= 0 {
		t.Errorf("controller latency histograms: %v", ctrl1)
	}

	for _, url := range []string{"http://" + drv.agentHealth + "/healthz", "http://" + drv.agentHealth + "/readyz",
		"http://" + drv.ctrlHealth + "/healthz", "http://" + drv.ctrlHealth + "/readyz"} {
		testenv.WantOK(t, url)
	}
}
