package agent

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"sort"
	"strings"

	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/berth-io/berth/api/v1alpha1"
	"github.com/berth-io/berth/internal/backend"
	"github.com/berth-io/berth/internal/blockdev"
	"github.com/berth-io/berth/internal/metrics"
)

// errNoKeeper: this agent serves no userspace volumes.
var errNoKeeper = errors.New("no keeper: userspace volumes not enabled")

// NodeMetrics answers the agent's node gauges (metrics.NodeSource) from
// what the agent has at hand: its cache of this node's Volumes, the
// transport records of its userspace volumes and the keeper. Nothing here
// calls the API server.
type NodeMetrics struct {
	Agent *Agent
	// Volumes is the manager's cache, which holds this node's Volumes only.
	Volumes client.Reader
	// Usage reads the data dirs (backend.Set.Usage); nil: none.
	Usage func(ctx context.Context) (map[string]backend.Usage, error)
}

// DataDirs reports each data dir's filesystem and images, sorted by dir.
func (n NodeMetrics) DataDirs(ctx context.Context) ([]metrics.DataDirUsage, error) {
	if n.Usage == nil {
		return nil, nil
	}
	usage, err := n.Usage(ctx)
	out := make([]metrics.DataDirUsage, 0, len(usage))
	for dir, u := range usage {
		out = append(out, metrics.DataDirUsage{Dir: dir, Size: u.Size, Free: u.Free, Promised: u.Promised, Allocated: u.Allocated})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Dir < out[j].Dir })
	return out, err
}

// VolumeCounts counts this node's Volumes by state and transport.
func (n NodeMetrics) VolumeCounts(ctx context.Context) ([]metrics.VolumeCount, error) {
	var list v1.VolumeList
	if err := n.Volumes.List(ctx, &list, client.MatchingLabels{v1.NodeLabel: n.Agent.node}); err != nil {
		return nil, fmt.Errorf("list volumes of node %s: %w", n.Agent.node, err)
	}
	type key struct{ state, transport string }
	counts := map[key]int{}
	for i := range list.Items {
		vol := &list.Items[i]
		if vol.Spec.Node != n.Agent.node {
			continue
		}
		state := string(vol.Status.State)
		if state == "" {
			state = string(v1.VolumePending)
		}
		counts[key{state, string(n.Agent.stagedTransport(vol))}]++
	}
	out := make([]metrics.VolumeCount, 0, len(counts))
	for k, c := range counts {
		out = append(out, metrics.VolumeCount{State: k.state, Transport: k.transport, N: c})
	}
	sort.Slice(out, func(i, j int) bool {
		return out[i].State+"/"+out[i].Transport < out[j].State+"/"+out[j].Transport
	})
	return out, nil
}

// KeeperConnections asks the keeper how many FUSE connections it holds.
func (n NodeMetrics) KeeperConnections(ctx context.Context) (int, error) {
	us := n.Agent.us
	if us == nil || us.Keeper == nil {
		return 0, errNoKeeper
	}
	held, err := us.Keeper.List(ctx)
	if err != nil {
		return 0, err
	}
	return len(held), nil
}

// BlockdevIOErrors reads, per staged userspace volume, how many requests
// its blockdev servers answered with an I/O error (the files they keep
// beside their logs). No userspace volumes: none.
func (n NodeMetrics) BlockdevIOErrors(context.Context) (map[string]uint64, error) {
	us := n.Agent.us
	if us == nil || us.Root == "" {
		return nil, nil
	}
	entries, err := os.ReadDir(us.Root)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	out := map[string]uint64{}
	var errs []error
	for _, e := range entries {
		volume, ok := strings.CutSuffix(e.Name(), ioErrorsSuffix)
		if !ok || e.IsDir() {
			continue
		}
		c, err := blockdev.ReadIOErrors(ioErrorsFile(us.Root, volume))
		switch {
		case errors.Is(err, fs.ErrNotExist): // unstaged meanwhile
		case err != nil:
			errs = append(errs, err)
		default:
			out[volume] = c
		}
	}
	return out, errors.Join(errs...)
}
