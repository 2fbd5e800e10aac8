package csi

// Placement: local volumes live on one node, chosen from the topology the
// scheduler asks for, or by the free space agents report in CSIStorageCapacity objects.

import (
	"context"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
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
	live, err := s.liveCapacities(ctx)
	if err != nil {
		return "", err
	}
	best, bestFree := "", int64(-1)
	for name, free := range live {
		// Ties go to the first name, so that placement does not depend on
		// map order.
		if free > bestFree || (free == bestFree && name < best) {
			best, bestFree = name, free
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

// nodeCapacity is the free space the node's agent reports: the most any of
// its CSIStorageCapacity objects (one per class, all of one data dir) says.
func (s *Controller) nodeCapacity(ctx context.Context, name string) (int64, bool, error) {
	free, err := s.capacities(ctx, client.MatchingLabels{v1.NodeLabel: name})
	if err != nil {
		return 0, false, err
	}
	f, ok := free[name]
	return f, ok, nil
}

// capacities maps each node that has capacity objects matching sel to its
// free bytes. The node comes from the object's topology, which the admission
// policy ties to the node of the agent that wrote it.
func (s *Controller) capacities(ctx context.Context, sel client.ListOption) (map[string]int64, error) {
	var list storagev1.CSIStorageCapacityList
	if err := s.c.List(ctx, &list, client.InNamespace(s.cfg.Namespace), sel); err != nil {
		return nil, status.Errorf(codes.Unavailable, "list csistoragecapacities: %v", err)
	}
	free := map[string]int64{}
	for _, c := range list.Items {
		if c.NodeTopology == nil || c.Capacity == nil {
			continue
		}
		node := c.NodeTopology.MatchLabels[v1.TopologyNodeKey]
		if node == "" {
			continue
		}
		if f, seen := free[node]; !seen || c.Capacity.Value() > f {
			free[node] = c.Capacity.Value()
		}
	}
	return free, nil
}

// liveCapacities is capacities of every node that still exists: a deleted
// node's objects outlive it.
func (s *Controller) liveCapacities(ctx context.Context) (map[string]int64, error) {
	free, err := s.capacities(ctx, client.HasLabels{v1.NodeLabel})
	if err != nil {
		return nil, err
	}
	nodes := &corev1.NodeList{}
	if err := s.c.List(ctx, nodes); err != nil {
		return nil, status.Errorf(codes.Unavailable, "list nodes: %v", err)
	}
	live := map[string]int64{}
	for _, n := range nodes.Items {
		if f, ok := free[n.Name]; ok {
			live[n.Name] = f
		}
	}
	return live, nil
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
	// A ceph cluster's capacity is its pool's; anything else (no such
	// cluster too) is answered from the nodes, as before clusters had backends.
	if name := req.GetParameters()[v1.ParamStorageCluster]; name != "" {
		sc := &v1.StorageCluster{}
		if err := s.c.Get(ctx, client.ObjectKey{Name: name}, sc); err == nil && sc.Spec.Backend == v1.BackendCeph {
			return s.cephCapacity(ctx, sc)
		}
	}
	if n := req.GetAccessibleTopology().GetSegments()[v1.TopologyNodeKey]; n != "" {
		free, _, err := s.nodeCapacity(ctx, n)
		if err != nil {
			return nil, err
		}
		return &csi.GetCapacityResponse{AvailableCapacity: free}, nil
	}
	live, err := s.liveCapacities(ctx)
	if err != nil {
		return nil, err
	}
	var most int64
	for _, free := range live {
		most = max(most, free)
	}
	return &csi.GetCapacityResponse{AvailableCapacity: most}, nil
}
