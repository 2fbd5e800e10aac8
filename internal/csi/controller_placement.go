package csi

// Placement: local volumes live on one node, chosen from the topology the
// scheduler asks for, or by the free space agents report on their Nodes.

import (
	"context"
	"strconv"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/berth-io/berth/api/v1alpha1"
)

// chooseNode picks the node of a new local volume: the first preferred, then
// requisite topology, or else the node whose agent reports the most free space.
func (s *Controller) chooseNode(ctx context.Context, top *csi.TopologyRequirement, size int64) (string, error) {
	for _, list := range [][]*csi.Topology{top.GetPreferred(), top.GetRequisite()} {
		for _, t := range list {
			if n := t.GetSegments()[v1.TopologyNodeKey]; n != "" {
				free, known, err := s.nodeCapacity(ctx, n)
				if err != nil {
					return "", err
				}
				if known && free < size {
					continue
				}
				return n, nil
			}
		}
	}
	if len(top.GetRequisite()) > 0 || len(top.GetPreferred()) > 0 {
		return "", status.Errorf(codes.ResourceExhausted, "no node of the requested topology has %d bytes free", size)
	}
	nodes := &corev1.NodeList{}
	if err := s.c.List(ctx, nodes); err != nil {
		return "", status.Errorf(codes.Unavailable, "list nodes: %v", err)
	}
	best, bestFree := "", int64(-1)
	for _, n := range nodes.Items {
		if free, ok := capacityOf(&n); ok && free > bestFree {
			best, bestFree = n.Name, free
		}
	}
	switch {
	case best == "":
		return "", status.Error(codes.ResourceExhausted, "no berth agent reports capacity on any node")
	case bestFree < size:
		return "", status.Errorf(codes.ResourceExhausted, "no node has %d bytes free (most: %d on %s)", size, bestFree, best)
	}
	return best, nil
}

func (s *Controller) nodeCapacity(ctx context.Context, name string) (int64, bool, error) {
	n := &corev1.Node{}
	if err := s.c.Get(ctx, client.ObjectKey{Name: name}, n); err != nil {
		if apierrors.IsNotFound(err) {
			return 0, false, nil
		}
		return 0, false, status.Errorf(codes.Unavailable, "get node %s: %v", name, err)
	}
	free, ok := capacityOf(n)
	return free, ok, nil
}

func capacityOf(n *corev1.Node) (int64, bool) {
	v, ok := n.Annotations[v1.CapacityAnnotation]
	if !ok {
		return 0, false
	}
	free, err := strconv.ParseInt(v, 10, 64)
	return free, err == nil
}

// GetCapacity implements csi.ControllerServer: the free space of the node the
// topology names, or the most any node has.
func (s *Controller) GetCapacity(ctx context.Context, req *csi.GetCapacityRequest) (*csi.GetCapacityResponse, error) {
	if len(req.GetVolumeCapabilities()) > 0 {
		if _, _, _, err := checkCapabilities(req.GetVolumeCapabilities()); err != nil {
			return nil, status.Error(codes.InvalidArgument, err.Error())
		}
	}
	if _, _, err := parseParameters(req.GetParameters()); err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	if n := req.GetAccessibleTopology().GetSegments()[v1.TopologyNodeKey]; n != "" {
		free, _, err := s.nodeCapacity(ctx, n)
		if err != nil {
			return nil, err
		}
		return &csi.GetCapacityResponse{AvailableCapacity: free}, nil
	}
	nodes := &corev1.NodeList{}
	if err := s.c.List(ctx, nodes); err != nil {
		return nil, status.Errorf(codes.Unavailable, "list nodes: %v", err)
	}
	var most int64
	for _, n := range nodes.Items {
		if free, ok := capacityOf(&n); ok && free > most {
			most = free
		}
	}
	return &csi.GetCapacityResponse{AvailableCapacity: most}, nil
}
