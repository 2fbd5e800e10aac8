package fence

import (
	"context"
	"fmt"
	"slices"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/berth-io/berth/api/v1alpha1"
)

// Event reasons.
const (
	EventConflict = "FenceConflict"
	EventBroken   = "FenceBroken"
)

// broken is one node whose holds on a volume are taken over.
type broken struct {
	node    string
	reason  v1.CleanupReason
	entries []v1.AttachmentEntry // all of the node's entries on the volume
}

// breakable decides, node by node, whether the blocking entries may be taken
// over. It returns what to move, or a *ConflictError naming the first holder
// that stays (after recording Events on the Attachment and the pod).
func (f *Fencer) breakable(ctx context.Context, att *v1.Attachment, blocking []v1.AttachmentEntry, req *Request, why string) ([]broken, error) {
	order, blockers := byNode(blocking)
	_, all := byNode(att.Spec.Attachments)
	var out []broken
	for _, node := range order {
		// A sole-device request breaks only the device holds; the node's
		// NFS clients of the share keep their entries.
		entries := all[node]
		if req.SoleDevice {
			entries = blockers[node]
		}
		reason, ok := v1.CleanupReason(""), false
		if node != req.Node { // our own node's holds are never broken by us
			var err error
			if reason, ok, err = f.verdict(ctx, node, entries, req); err != nil {
				return nil, err
			}
		}
		reasonWhy := why
		if ok && f.unfenceable(att, node, entries, req, reason) {
			// Its client may write still, and nothing says which it is
			// (F3): the lock stays until the node records it (its agent
			// does at every start) or its Node object is deleted.
			ok = false
			reasonWhy = "node " + node + " holds the volume's device but its Ceph clients are not recorded, so they cannot be fenced; " +
				"its lock is broken once its agent records them or its Node object is deleted"
		}
		if !ok {
			ce := &ConflictError{Volume: att.Name, Mode: att.Spec.AccessMode, Holder: blockers[node][0], Reason: reasonWhy}
			f.refused(att, req, ce)
			return nil, ce
		}
		out = append(out, broken{node: node, reason: reason, entries: entries})
	}
	return out, nil
}

// unfenceable tells whether breaking node's holds on a ceph volume
// (Request.Ceph, or any volume of a Fencer with a Blocklister) would leave
// a writer unfenced: the node holds the device (a stage record) and its
// status records no Ceph client. A gone Node's holds move anyway, as the
// GC moves them.
func (f *Fencer) unfenceable(att *v1.Attachment, node string, entries []v1.AttachmentEntry, req *Request, reason v1.CleanupReason) bool {
	if (!req.Ceph && f.opts.Blocklister == nil) || reason == v1.ReasonNodeGone || len(cephClients(att, node)) > 0 {
		return false
	}
	return slices.ContainsFunc(entries, func(e v1.AttachmentEntry) bool { return e.IsStage() })
}

// OutOfService tells whether an operator declared the node lost: the
// taint that also lets Kubernetes detach its volumes and force-delete its
// pods, and berth break its locks.
func OutOfService(n *corev1.Node) bool {
	for _, t := range n.Spec.Taints {
		if t.Key == corev1.TaintNodeOutOfService {
			return true
		}
	}
	return false
}

// verdict applies the lock-breaking rules to one other node's entries:
// the node object is gone, the node is tainted out-of-service, or every pod
// it holds the volume for was recreated (new UID) and scheduled to the
// requesting node.
func (f *Fencer) verdict(ctx context.Context, node string, entries []v1.AttachmentEntry, req *Request) (v1.CleanupReason, bool, error) {
	var n corev1.Node
	if err := f.c.Get(ctx, client.ObjectKey{Name: node}, &n); apierrors.IsNotFound(err) {
		return v1.ReasonNodeGone, true, nil
	} else if err != nil {
		return "", false, fmt.Errorf("get node %s: %w", node, err)
	}
	if OutOfService(&n) {
		return v1.ReasonNodeOutOfService, true, nil
	}
	moved, err := f.podsMovedHere(ctx, entries, req)
	if err != nil || !moved {
		return "", false, err
	}
	return v1.ReasonPodMoved, true, nil
}

// podsMovedHere tells whether each pod entry names a pod whose old object is
// gone and whose successor (same namespace/name, new UID) runs on the
// requesting node. A stage request knows no pod, so the successor's
// spec.nodeName is what ties it to the request; a publish request must be
// that successor. A node with only a stage record left is not taken over:
// its unstage is on its way.
func (f *Fencer) podsMovedHere(ctx context.Context, entries []v1.AttachmentEntry, req *Request) (bool, error) {
	pods := 0
	for _, e := range entries {
		if e.IsStage() {
			continue
		}
		pods++
		if !req.IsStage() && (e.PodNamespace != req.PodNamespace || e.Pod != req.Pod) {
			return false, nil
		}
		var p corev1.Pod
		if err := f.c.Get(ctx, client.ObjectKey{Namespace: e.PodNamespace, Name: e.Pod}, &p); apierrors.IsNotFound(err) {
			return false, nil // gone without successor: the GC's business
		} else if err != nil {
			return false, fmt.Errorf("get pod %s/%s: %w", e.PodNamespace, e.Pod, err)
		}
		if string(p.UID) == e.PodUID || p.Spec.NodeName != req.Node {
			return false, nil
		}
		if !req.IsStage() && string(p.UID) != req.PodUID {
			return false, nil
		}
	}
	return pods > 0, nil
}

// moveToStale writes the broken entries to their nodes' stale lists, and
// blocklists (through bl) the Ceph clients att's status records for those
// nodes. It runs
// before the Attachment update that drops them: a crash in between leaves
// an entry the cleaner finds still held and drops, never a hold nobody
// undoes. A node's clients are recorded on its stale list before they are
// blocklisted, so that the Unfencer takes off whatever landed; if
// blocklisting fails, the lock is not broken.
func (f *Fencer) moveToStale(ctx context.Context, att *v1.Attachment, bs []broken, bl Blocklister) error {
	volume := att.Name
	for _, b := range bs {
		stale := make([]v1.StaleAttachment, 0, len(b.entries))
		for _, e := range b.entries {
			stale = append(stale, staleFrom(volume, e, b.reason, f.clk))
		}
		addrs := cephClients(att, b.node)
		if err := addStale(ctx, f.c, f.clk, f.opts, b.node, stale, blocklisted(volume, addrs, b.reason, f.clk)); err != nil {
			return err
		}
		if len(addrs) > 0 {
			if err := fenceClients(ctx, bl, f.rec, volume, b.node, b.reason, addrs); err != nil {
				f.log.Error(err, "fence not broken: Ceph clients not blocklisted", "volume", volume, "node", b.node)
				return err
			}
			f.log.Info("ceph clients blocklisted", "volume", volume, "node", b.node, "addresses", addrs, "reason", b.reason)
		}
		f.log.Info("fence broken", "volume", volume, "node", b.node, "reason", b.reason, "entries", len(b.entries))
		f.opts.Metrics.Broke(string(b.reason))
		f.rec.Eventf(attachmentRef(volume, ""), corev1.EventTypeWarning, EventBroken,
			"took over %d entries of node %s: %s", len(b.entries), b.node, b.reason)
	}
	return nil
}

// without drops the broken entries.
func without(entries []v1.AttachmentEntry, bs []broken) []v1.AttachmentEntry {
	gone := map[[2]string]bool{}
	for _, b := range bs {
		for _, e := range b.entries {
			gone[[2]string{e.Node, e.MountDir}] = true
		}
	}
	out := entries[:0:0]
	for _, e := range entries {
		if !gone[[2]string{e.Node, e.MountDir}] {
			out = append(out, e)
		}
	}
	return out
}

// refused records a refusal on the Attachment and on the requesting pod.
func (f *Fencer) refused(att *v1.Attachment, req *Request, ce *ConflictError) {
	who := "node " + req.Node
	if !req.IsStage() {
		who = fmt.Sprintf("pod %s/%s on node %s", req.PodNamespace, req.Pod, req.Node)
	}
	f.log.Info("fence refused", "volume", att.Name, "requester", who, "holder", Describe(ce.Holder), "reason", ce.Reason)
	f.rec.Eventf(attachmentRef(att.Name, string(att.UID)), corev1.EventTypeWarning, EventConflict,
		"refused %s: held by %s: %s", who, Describe(ce.Holder), ce.Reason)
	if !req.IsStage() {
		f.rec.Eventf(&corev1.ObjectReference{Kind: "Pod", APIVersion: "v1", Namespace: req.PodNamespace, Name: req.Pod, UID: typesUID(req.PodUID)},
			corev1.EventTypeWarning, EventConflict, "volume %s is held by %s: %s", att.Name, Describe(ce.Holder), ce.Reason)
	}
}
