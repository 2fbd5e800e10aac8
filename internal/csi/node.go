package csi

import (
	"context"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	v1 "github.com/berth-io/berth/api/v1alpha1"
	"github.com/berth-io/berth/internal/agent"
	"github.com/berth-io/berth/internal/agent/errcode"
)

// Pod information kubelet passes in the volume context (podInfoOnMount).
const (
	ctxPodName      = "csi.storage.k8s.io/pod.name"
	ctxPodNamespace = "csi.storage.k8s.io/pod.namespace"
	ctxPodUID       = "csi.storage.k8s.io/pod.uid"
)

// Node is the CSI Node service over the agent's volume operations.
type Node struct {
	csi.UnimplementedNodeServer
	agent   *agent.Agent
	maxVols int64
}

// NewNode returns the Node service. maxVolumes caps volumes per node (0: no cap).
func NewNode(a *agent.Agent, maxVolumes int64) *Node {
	return &Node{agent: a, maxVols: maxVolumes}
}

// NodeGetInfo implements csi.NodeServer.
func (s *Node) NodeGetInfo(context.Context, *csi.NodeGetInfoRequest) (*csi.NodeGetInfoResponse, error) {
	return &csi.NodeGetInfoResponse{
		NodeId:             s.agent.Node(),
		MaxVolumesPerNode:  s.maxVols,
		AccessibleTopology: &csi.Topology{Segments: map[string]string{v1.TopologyNodeKey: s.agent.Node()}},
	}, nil
}

// NodeGetCapabilities implements csi.NodeServer.
func (s *Node) NodeGetCapabilities(context.Context, *csi.NodeGetCapabilitiesRequest) (*csi.NodeGetCapabilitiesResponse, error) {
	var caps []*csi.NodeServiceCapability
	for _, t := range []csi.NodeServiceCapability_RPC_Type{
		csi.NodeServiceCapability_RPC_STAGE_UNSTAGE_VOLUME,
		csi.NodeServiceCapability_RPC_GET_VOLUME_STATS,
		csi.NodeServiceCapability_RPC_EXPAND_VOLUME,
		csi.NodeServiceCapability_RPC_VOLUME_CONDITION,
		csi.NodeServiceCapability_RPC_SINGLE_NODE_MULTI_WRITER,
	} {
		caps = append(caps, &csi.NodeServiceCapability{Type: &csi.NodeServiceCapability_Rpc{Rpc: &csi.NodeServiceCapability_RPC{Type: t}}})
	}
	return &csi.NodeGetCapabilitiesResponse{Capabilities: caps}, nil
}

// NodeStageVolume implements csi.NodeServer.
func (s *Node) NodeStageVolume(ctx context.Context, req *csi.NodeStageVolumeRequest) (*csi.NodeStageVolumeResponse, error) {
	switch {
	case req.GetVolumeId() == "":
		return nil, status.Error(codes.InvalidArgument, "volume ID missing")
	case req.GetStagingTargetPath() == "":
		return nil, status.Error(codes.InvalidArgument, "staging target path missing")
	case req.GetVolumeCapability() == nil:
		return nil, status.Error(codes.InvalidArgument, "volume capability missing")
	}
	_, volMode, fsType, err := checkCapabilities([]*csi.VolumeCapability{req.GetVolumeCapability()})
	if err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	if err := s.checkArgs(req.GetVolumeId(), req.GetStagingTargetPath()); err != nil {
		return nil, err
	}
	err = s.agent.Stage(ctx, agent.StageRequest{
		VolumeID: req.GetVolumeId(), StagingPath: req.GetStagingTargetPath(), FSType: fsType,
		MountFlags: req.GetVolumeCapability().GetMount().GetMountFlags(), Block: volMode == v1.VolumeModeBlock,
		ReadOnly: readOnlyMode(req.GetVolumeCapability()),
	})
	if err != nil {
		return nil, toStatus(err)
	}
	return &csi.NodeStageVolumeResponse{}, nil
}

// NodeUnstageVolume implements csi.NodeServer.
func (s *Node) NodeUnstageVolume(ctx context.Context, req *csi.NodeUnstageVolumeRequest) (*csi.NodeUnstageVolumeResponse, error) {
	switch {
	case req.GetVolumeId() == "":
		return nil, status.Error(codes.InvalidArgument, "volume ID missing")
	case req.GetStagingTargetPath() == "":
		return nil, status.Error(codes.InvalidArgument, "staging target path missing")
	}
	if err := s.checkArgs(req.GetVolumeId(), req.GetStagingTargetPath()); err != nil {
		return nil, err
	}
	if err := s.agent.Unstage(ctx, req.GetVolumeId(), req.GetStagingTargetPath()); err != nil {
		return nil, toStatus(err)
	}
	return &csi.NodeUnstageVolumeResponse{}, nil
}

// NodePublishVolume implements csi.NodeServer.
func (s *Node) NodePublishVolume(ctx context.Context, req *csi.NodePublishVolumeRequest) (*csi.NodePublishVolumeResponse, error) {
	switch {
	case req.GetVolumeId() == "":
		return nil, status.Error(codes.InvalidArgument, "volume ID missing")
	case req.GetTargetPath() == "":
		return nil, status.Error(codes.InvalidArgument, "target path missing")
	case req.GetVolumeCapability() == nil:
		return nil, status.Error(codes.InvalidArgument, "volume capability missing")
	case req.GetStagingTargetPath() == "":
		return nil, status.Error(codes.InvalidArgument, "staging target path missing: berth stages volumes first (STAGE_UNSTAGE_VOLUME)")
	}
	_, volMode, _, err := checkCapabilities([]*csi.VolumeCapability{req.GetVolumeCapability()})
	if err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	if err := s.checkArgs(req.GetVolumeId(), req.GetStagingTargetPath(), req.GetTargetPath()); err != nil {
		return nil, err
	}
	vc := req.GetVolumeContext()
	err = s.agent.Publish(ctx, agent.PublishRequest{
		VolumeID: req.GetVolumeId(), StagingPath: req.GetStagingTargetPath(), TargetPath: req.GetTargetPath(),
		Block: volMode == v1.VolumeModeBlock, ReadOnly: req.GetReadonly() || readOnlyMode(req.GetVolumeCapability()),
		MountFlags: req.GetVolumeCapability().GetMount().GetMountFlags(),
		Pod:        agent.Pod{Namespace: vc[ctxPodNamespace], Name: vc[ctxPodName], UID: vc[ctxPodUID]},
	})
	if err != nil {
		return nil, toStatus(err)
	}
	return &csi.NodePublishVolumeResponse{}, nil
}

// NodeUnpublishVolume implements csi.NodeServer.
func (s *Node) NodeUnpublishVolume(ctx context.Context, req *csi.NodeUnpublishVolumeRequest) (*csi.NodeUnpublishVolumeResponse, error) {
	switch {
	case req.GetVolumeId() == "":
		return nil, status.Error(codes.InvalidArgument, "volume ID missing")
	case req.GetTargetPath() == "":
		return nil, status.Error(codes.InvalidArgument, "target path missing")
	}
	if err := s.checkArgs(req.GetVolumeId(), req.GetTargetPath()); err != nil {
		return nil, err
	}
	if err := s.agent.Unpublish(ctx, req.GetVolumeId(), req.GetTargetPath()); err != nil {
		return nil, toStatus(err)
	}
	return &csi.NodeUnpublishVolumeResponse{}, nil
}

// NodeGetVolumeStats implements csi.NodeServer.
func (s *Node) NodeGetVolumeStats(ctx context.Context, req *csi.NodeGetVolumeStatsRequest) (*csi.NodeGetVolumeStatsResponse, error) {
	switch {
	case req.GetVolumeId() == "":
		return nil, status.Error(codes.InvalidArgument, "volume ID missing")
	case req.GetVolumePath() == "":
		return nil, status.Error(codes.InvalidArgument, "volume path missing")
	}
	if !validID(req.GetVolumeId()) {
		return nil, status.Errorf(codes.NotFound, "volume %q not found", req.GetVolumeId())
	}
	if err := s.checkVolumePath(req.GetVolumeId(), req.GetVolumePath()); err != nil {
		return nil, err
	}
	st, err := s.agent.Stats(ctx, req.GetVolumeId(), req.GetVolumePath())
	if err != nil {
		return nil, toStatus(err)
	}
	abnormal, msg := s.agent.Condition(ctx, req.GetVolumeId(), req.GetVolumePath())
	resp := &csi.NodeGetVolumeStatsResponse{VolumeCondition: &csi.VolumeCondition{Abnormal: abnormal, Message: msg}}
	resp.Usage = []*csi.VolumeUsage{{Unit: csi.VolumeUsage_BYTES, Total: st.TotalBytes, Used: st.UsedBytes, Available: st.AvailableBytes}}
	if !st.Block {
		resp.Usage = append(resp.Usage, &csi.VolumeUsage{Unit: csi.VolumeUsage_INODES, Total: st.TotalInodes, Used: st.UsedInodes, Available: st.FreeInodes})
	}
	return resp, nil
}

// NodeExpandVolume implements csi.NodeServer.
func (s *Node) NodeExpandVolume(ctx context.Context, req *csi.NodeExpandVolumeRequest) (*csi.NodeExpandVolumeResponse, error) {
	switch {
	case req.GetVolumeId() == "":
		return nil, status.Error(codes.InvalidArgument, "volume ID missing")
	case req.GetVolumePath() == "":
		return nil, status.Error(codes.InvalidArgument, "volume path missing")
	}
	if !validID(req.GetVolumeId()) {
		return nil, status.Errorf(codes.NotFound, "volume %q not found", req.GetVolumeId())
	}
	if err := s.checkVolumePath(req.GetVolumeId(), req.GetVolumePath(), req.GetStagingTargetPath()); err != nil {
		return nil, err
	}
	block := req.GetVolumeCapability().GetBlock() != nil
	if req.GetVolumeCapability() != nil {
		if _, _, _, err := checkCapabilities([]*csi.VolumeCapability{req.GetVolumeCapability()}); err != nil {
			return nil, status.Error(codes.InvalidArgument, err.Error())
		}
	}
	path := req.GetVolumePath()
	if req.GetStagingTargetPath() != "" && !block {
		path = req.GetStagingTargetPath()
	}
	size, err := s.agent.Expand(ctx, req.GetVolumeId(), path, block)
	if err != nil {
		return nil, toStatus(err)
	}
	return &csi.NodeExpandVolumeResponse{CapacityBytes: size}, nil
}

// checkArgs refuses a volume ID that breaks the volume ID rule (no such
// volume can exist) and a path outside kubelet's volume folders for berth.
func (s *Node) checkArgs(id string, paths ...string) error {
	if !validID(id) {
		return status.Errorf(codes.NotFound, "volume %q not found", id)
	}
	for _, p := range paths {
		if err := s.agent.Paths().Check(p); err != nil {
			return status.Error(codes.InvalidArgument, err.Error())
		}
	}
	return nil
}

// checkVolumePath refuses, before anything runs, a path outside kubelet's
// volume folders for berth (statfs or a grow of any filesystem on the node
// otherwise): no volume of berth's is there, the spec's NotFound, which is
// also what csi-sanity expects of "some/path". An empty path passes (an
// optional one left out).
func (s *Node) checkVolumePath(id string, paths ...string) error {
	for _, p := range paths {
		if p == "" {
			continue
		}
		if err := s.agent.Paths().Check(p); err != nil {
			return status.Errorf(codes.NotFound, "volume %q is not at %q: %v", id, p, err)
		}
	}
	return nil
}

func readOnlyMode(c *csi.VolumeCapability) bool {
	switch c.GetAccessMode().GetMode() {
	case csi.VolumeCapability_AccessMode_SINGLE_NODE_READER_ONLY, csi.VolumeCapability_AccessMode_MULTI_NODE_READER_ONLY:
		return true
	}
	return false
}

// toStatus maps the agent's errors to the codes the CSI spec names, by the
// table the agent socket answers with too.
func toStatus(err error) error {
	return status.Error(errcode.Code(err), err.Error())
}
