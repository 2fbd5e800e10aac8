package csi

import (
	"context"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	v1 "github.com/berth-io/berth/api/v1alpha1"
	"github.com/berth-io/berth/internal/agent"
	"github.com/berth-io/berth/internal/agent/errcode"
	"github.com/berth-io/berth/internal/volid"
)

// Pod information kubelet passes in the volume context (podInfoOnMount).
const (
	ctxPodName      = "csi.storage.k8s.io/pod.name"
	ctxPodNamespace = "csi.storage.k8s.io/pod.namespace"
	ctxPodUID       = "csi.storage.k8s.io/pod.uid"
)

// Node is the CSI Node service over the agent's volume operations. A
// request's volume handle is the volume ID, or volid.ShareDevice of it: the
// share manager's PersistentVolume of a read-write-many filesystem volume,
// which stage and publish pass on as the request's ShareDevice.
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
	id, viaShare := volid.ParseHandle(req.GetVolumeId())
	volMode, fsType, err := s.checkAttach(id, req.GetVolumeCapability(), text("staging target path", req.GetStagingTargetPath()))
	if err != nil {
		return nil, err
	}
	err = s.agent.Stage(ctx, agent.StageRequest{
		VolumeID: id, ShareDevice: viaShare, StagingPath: req.GetStagingTargetPath(), FSType: fsType,
		MountFlags: req.GetVolumeCapability().GetMount().GetMountFlags(), Block: volMode == v1.VolumeModeBlock,
		ReadOnly: readOnlyMode(req.GetVolumeCapability()), Secrets: req.GetSecrets(),
	})
	if err != nil {
		return nil, toStatus(err)
	}
	return &csi.NodeStageVolumeResponse{}, nil
}

// NodeUnstageVolume implements csi.NodeServer.
func (s *Node) NodeUnstageVolume(ctx context.Context, req *csi.NodeUnstageVolumeRequest) (*csi.NodeUnstageVolumeResponse, error) {
	if err := s.undo(ctx, req.GetVolumeId(), text("staging target path", req.GetStagingTargetPath()), s.agent.Unstage); err != nil {
		return nil, err
	}
	return &csi.NodeUnstageVolumeResponse{}, nil
}

// NodePublishVolume implements csi.NodeServer.
func (s *Node) NodePublishVolume(ctx context.Context, req *csi.NodePublishVolumeRequest) (*csi.NodePublishVolumeResponse, error) {
	staging := text("staging target path", req.GetStagingTargetPath())
	staging.hint = ": berth stages volumes first (STAGE_UNSTAGE_VOLUME)"
	id, viaShare := volid.ParseHandle(req.GetVolumeId())
	volMode, _, err := s.checkAttach(id, req.GetVolumeCapability(), text("target path", req.GetTargetPath()), staging)
	if err != nil {
		return nil, err
	}
	vc := req.GetVolumeContext()
	err = s.agent.Publish(ctx, agent.PublishRequest{
		VolumeID: id, ShareDevice: viaShare, StagingPath: req.GetStagingTargetPath(), TargetPath: req.GetTargetPath(),
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
	op := s.agent.Unpublish
	if _, viaShare := volid.ParseHandle(req.GetVolumeId()); viaShare {
		op = s.agent.UnpublishShareDevice
	}
	if err := s.undo(ctx, req.GetVolumeId(), text("target path", req.GetTargetPath()), op); err != nil {
		return nil, err
	}
	return &csi.NodeUnpublishVolumeResponse{}, nil
}

// NodeGetVolumeStats implements csi.NodeServer.
func (s *Node) NodeGetVolumeStats(ctx context.Context, req *csi.NodeGetVolumeStatsRequest) (*csi.NodeGetVolumeStatsResponse, error) {
	id, _ := volid.ParseHandle(req.GetVolumeId())
	// kubelet asks a block volume's usage at its bind mount of the device
	// for a pod, a path no other request names.
	if err := s.checkVolumeAt(s.agent.Paths().CheckStats, id, req.GetVolumePath()); err != nil {
		return nil, err
	}
	st, err := s.agent.Stats(ctx, id, req.GetVolumePath())
	if err != nil {
		return nil, toStatus(err)
	}
	abnormal, msg := s.agent.Condition(ctx, id, req.GetVolumePath())
	resp := &csi.NodeGetVolumeStatsResponse{VolumeCondition: &csi.VolumeCondition{Abnormal: abnormal, Message: msg}}
	resp.Usage = []*csi.VolumeUsage{{Unit: csi.VolumeUsage_BYTES, Total: st.TotalBytes, Used: st.UsedBytes, Available: st.AvailableBytes}}
	if !st.Block {
		resp.Usage = append(resp.Usage, &csi.VolumeUsage{Unit: csi.VolumeUsage_INODES, Total: st.TotalInodes, Used: st.UsedInodes, Available: st.FreeInodes})
	}
	return resp, nil
}

// NodeExpandVolume implements csi.NodeServer.
func (s *Node) NodeExpandVolume(ctx context.Context, req *csi.NodeExpandVolumeRequest) (*csi.NodeExpandVolumeResponse, error) {
	id, _ := volid.ParseHandle(req.GetVolumeId())
	if err := s.checkVolume(id, req.GetVolumePath(), req.GetStagingTargetPath()); err != nil {
		return nil, err
	}
	block := req.GetVolumeCapability().GetBlock() != nil
	if req.GetVolumeCapability() != nil {
		if _, _, err := checkCapability(req.GetVolumeCapability()); err != nil {
			return nil, err
		}
	}
	path := req.GetVolumePath()
	if req.GetStagingTargetPath() != "" && !block {
		path = req.GetStagingTargetPath()
	}
	size, err := s.agent.Expand(ctx, id, path, block)
	if err != nil {
		return nil, toStatus(err)
	}
	return &csi.NodeExpandVolumeResponse{CapacityBytes: size}, nil
}

// arg is one argument a request must carry: its name for the error, and
// whether the request left it out.
type arg struct {
	name   string
	value  string // a text argument's value
	absent bool
	hint   string // added to the error, after "missing"
}

// text is a string argument, left out when empty.
func text(name, value string) arg { return arg{name: name, value: value, absent: value == ""} }

// required refuses with InvalidArgument the first argument left out, in the
// order given: the order each RPC has always checked them in.
func required(args ...arg) error {
	for _, a := range args {
		if a.absent {
			return status.Error(codes.InvalidArgument, a.name+" missing"+a.hint)
		}
	}
	return nil
}

// checkCapability checks the one capability a node RPC carries, refusing an
// unsupported one with InvalidArgument.
func checkCapability(c *csi.VolumeCapability) (v1.VolumeMode, string, error) {
	_, volMode, fsType, err := checkCapabilities([]*csi.VolumeCapability{c})
	if err != nil {
		return "", "", status.Error(codes.InvalidArgument, err.Error())
	}
	return volMode, fsType, nil
}

// checkAttach checks what stage and publish both carry, in the order they
// have always checked it: the volume ID, the first path, the capability and
// further paths present; then the capability itself, the volume ID rule and
// each path. It returns the capability's volume mode and fs type.
func (s *Node) checkAttach(id string, c *csi.VolumeCapability, paths ...arg) (v1.VolumeMode, string, error) {
	args := []arg{text("volume ID", id), paths[0], {name: "volume capability", absent: c == nil}}
	if err := required(append(args, paths[1:]...)...); err != nil {
		return "", "", err
	}
	volMode, fsType, err := checkCapability(c)
	if err != nil {
		return "", "", err
	}
	values := make([]string, len(paths))
	for i, p := range paths {
		values[i] = p.value
	}
	if err := s.checkArgs(id, values...); err != nil {
		return "", "", err
	}
	return volMode, fsType, nil
}

// undo is unstage and unpublish: both take a volume handle and one path,
// check them alike, and hand the volume ID and path to the agent (op).
func (s *Node) undo(ctx context.Context, handle string, path arg, op func(ctx context.Context, id, path string) error) error {
	id, _ := volid.ParseHandle(handle)
	if err := required(text("volume ID", id), path); err != nil {
		return err
	}
	p := path.value
	if err := s.checkArgs(id, p); err != nil {
		return err
	}
	if err := op(ctx, id, p); err != nil {
		return toStatus(err)
	}
	return nil
}

// checkArgs refuses a volume ID that breaks the volume ID rule (no such
// volume can exist) and a path outside kubelet's volume folders for berth.
func (s *Node) checkArgs(id string, paths ...string) error {
	if err := knownID(id); err != nil {
		return err
	}
	for _, p := range paths {
		if err := s.agent.Paths().Check(p); err != nil {
			return status.Error(codes.InvalidArgument, err.Error())
		}
	}
	return nil
}

// checkVolume checks the arguments of stats and expand: a volume ID and a
// volume path, both required, and optional further paths.
func (s *Node) checkVolume(id, volumePath string, more ...string) error {
	return s.checkVolumeAt(s.agent.Paths().Check, id, volumePath, more...)
}

// checkVolumeAt is checkVolume with check as the path rule.
func (s *Node) checkVolumeAt(check func(string) error, id, volumePath string, more ...string) error {
	if err := required(text("volume ID", id), text("volume path", volumePath)); err != nil {
		return err
	}
	if err := knownID(id); err != nil {
		return err
	}
	return checkVolumePath(check, id, append([]string{volumePath}, more...)...)
}

// knownID refuses, as NotFound, a volume ID that breaks the volume ID rule:
// no such volume can exist.
func knownID(id string) error {
	if !validID(id) {
		return status.Errorf(codes.NotFound, "volume %q not found", id)
	}
	return nil
}

// checkVolumePath refuses, before anything runs, a path outside kubelet's
// volume folders for berth (statfs or a grow of any filesystem on the node
// otherwise): no volume of berth's is there, the spec's NotFound, which is
// also what csi-sanity expects of "some/path". An empty path passes (an
// optional one left out).
func checkVolumePath(check func(string) error, id string, paths ...string) error {
	for _, p := range paths {
		if p == "" {
			continue
		}
		if err := check(p); err != nil {
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
