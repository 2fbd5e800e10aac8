package fence

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/api/equality"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/berth-io/berth/api/v1alpha1"
	"github.com/berth-io/berth/internal/volerr"
)

// Staged says where a volume is staged on one node, for the Attachment's
// status (what `kubectl get attachments -o wide` shows).
type Staged struct {
	Node        string
	DevicePath  string
	StagingPath string
	// CephClients are the Ceph client addresses of the server(s) serving
	// a Ceph volume on the node (cephaddr.Client of their connections):
	// lock breaking blocklists them. Empty for other backends.
	CephClients []string
}

// ReportStaged records in the volume's Attachment status that the node has
// it staged on a device; with DevicePath empty it removes the node's entry
// (unstaged). Entries of nodes that no longer hold the volume (their lock
// was broken) are dropped on the way. A missing Attachment means nothing is
// held: nothing to report, unless s records Ceph clients, which must land
// (the caller uses the device only then): ErrNotHeld.
func (f *Fencer) ReportStaged(ctx context.Context, volume string, s Staged) error {
	if volume == "" || s.Node == "" {
		return fmt.Errorf("%w: report needs volume and node (got %q, %q)", volerr.ErrInvalid, volume, s.Node)
	}
	return retry(ctx, f.clk, f.opts, "report staged "+volume, func() (bool, error) {
		var att v1.Attachment
		found, err := lookup(ctx, f.c, "attachment", client.ObjectKey{Name: volume}, &att)
		if err == nil && len(s.CephClients) > 0 && (!found || !slices.ContainsFunc(att.Spec.Attachments, func(e v1.AttachmentEntry) bool { return e.Node == s.Node })) {
			return true, fmt.Errorf("volume %s: node %s holds no entry to record its ceph clients on: %w", volume, s.Node, ErrNotHeld)
		}
		if !found {
			return true, err
		}
		nodes := stagedNodes(&att, s)
		if equality.Semantic.DeepEqual(nodes, att.Status.Nodes) {
			return true, nil
		}
		att.Status.Nodes = nodes
		att.Status.Devices = devicesSummary(nodes)
		if err := f.c.Status().Update(ctx, &att); err != nil {
			return !raced(err), fmt.Errorf("update attachment %s status: %w", volume, err)
		}
		return true, nil
	})
}

// stagedNodes is att's status entries with s applied, keeping only nodes
// that still hold an entry in the spec, in node order.
func stagedNodes(att *v1.Attachment, s Staged) []v1.AttachmentNodeStatus {
	holds := map[string]bool{}
	for _, e := range att.Spec.Attachments {
		holds[e.Node] = true
	}
	out := make([]v1.AttachmentNodeStatus, 0, len(att.Status.Nodes)+1)
	for _, n := range att.Status.Nodes {
		if n.Node != s.Node && holds[n.Node] {
			out = append(out, n)
		}
	}
	if s.DevicePath != "" && holds[s.Node] {
		out = append(out, v1.AttachmentNodeStatus{Node: s.Node, DevicePath: s.DevicePath, StagingPath: s.StagingPath, Staged: true,
			CephClients: slices.Clone(s.CephClients)})
	}
	slices.SortFunc(out, func(a, b v1.AttachmentNodeStatus) int { return strings.Compare(a.Node, b.Node) })
	return out
}

func devicesSummary(nodes []v1.AttachmentNodeStatus) string {
	parts := make([]string, 0, len(nodes))
	for _, n := range nodes {
		parts = append(parts, n.Node+"="+n.DevicePath)
	}
	return strings.Join(parts, ", ")
}
