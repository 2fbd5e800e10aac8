package fence

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/berth-io/berth/api/v1alpha1"
)

func staleFrom(volume string, e v1.AttachmentEntry, reason v1.CleanupReason, clk clock.PassiveClock) v1.StaleAttachment {
	s := v1.StaleAttachment{
		Volume:      volume,
		MountDir:    e.MountDir,
		StagingPath: e.StagingPath,
		PodUID:      e.PodUID,
		Reason:      reason,
		FoundAt:     metav1.NewTime(clk.Now()),
	}
	if !e.IsStage() {
		s.Pod = e.PodNamespace + "/" + e.Pod
	}
	return s
}

// addStale merges entries (and blocklisted Ceph clients) into the node's
// NodeCleanup, creating it. An entry already listed for the same (volume,
// mountDir) and pod is kept as is, so a repeated move changes nothing.
func addStale(ctx context.Context, c client.Client, clk clock.Clock, opts Options, node string, entries []v1.StaleAttachment, blocked []v1.BlocklistedClient) error {
	return retry(ctx, clk, opts, "add stale entries for node "+node, func() (bool, error) {
		var nc v1.NodeCleanup
		if err := c.Get(ctx, client.ObjectKey{Name: node}, &nc); apierrors.IsNotFound(err) {
			nc = v1.NodeCleanup{ObjectMeta: metav1.ObjectMeta{Name: node}, Spec: v1.NodeCleanupSpec{Entries: entries, Blocklisted: blocked}}
			if err := c.Create(ctx, &nc); err != nil {
				return !raced(err), fmt.Errorf("create nodecleanup %s: %w", node, err)
			}
			return true, nil
		} else if err != nil {
			return true, fmt.Errorf("get nodecleanup %s: %w", node, err)
		}
		var changed bool
		nc.Spec.Blocklisted, changed = mergeBlocklisted(nc.Spec.Blocklisted, blocked)
		for _, s := range entries {
			i := findStale(nc.Spec.Entries, s.Volume, s.MountDir)
			switch {
			case i < 0:
				nc.Spec.Entries = append(nc.Spec.Entries, s)
			case nc.Spec.Entries[i].PodUID != s.PodUID:
				nc.Spec.Entries[i] = s
			default:
				continue
			}
			changed = true
		}
		if !changed {
			return true, nil
		}
		if err := c.Update(ctx, &nc); err != nil {
			return !raced(err), fmt.Errorf("update nodecleanup %s: %w", node, err)
		}
		return true, nil
	})
}

func findStale(entries []v1.StaleAttachment, volume, mountDir string) int {
	for i := range entries {
		if entries[i].Volume == volume && entries[i].MountDir == mountDir {
			return i
		}
	}
	return -1
}

func attachmentRef(name, uid string) *corev1.ObjectReference {
	return &corev1.ObjectReference{Kind: "Attachment", APIVersion: v1.GroupVersion.String(), Name: name, UID: typesUID(uid)}
}

func typesUID(s string) types.UID { return types.UID(s) }

// EvictNode moves every entry that node holds on volume to the node's stale
// list with reason, and removes them from the Attachment (deleting it when
// nothing is left). It returns how many entries moved. For a caller that
// gives up waiting for that node's agent (a deletion that must not hang);
// the agent undoes the entries when it is back. The node's recorded Ceph
// clients of the volume are blocklisted first, through opts.Blocklister,
// as lock breaking does: the node may only be cut off and still writing,
// and the image outlives the deletion (F17). Without a Blocklister, or if
// blocklisting fails, nothing moves and the error says why.
func EvictNode(ctx context.Context, c client.Client, clk clock.Clock, opts Options, volume, node string, reason v1.CleanupReason) (int, error) {
	opts = opts.withDefaults()
	moved := 0
	err := retry(ctx, clk, opts, "evict node "+node+" from "+volume, func() (bool, error) {
		moved = 0
		var att v1.Attachment
		if found, err := lookup(ctx, c, "attachment", client.ObjectKey{Name: volume}, &att); !found {
			return true, err
		}
		kept := att.Spec.Attachments[:0:0]
		var stale []v1.StaleAttachment
		for _, e := range att.Spec.Attachments {
			if e.Node == node {
				stale = append(stale, staleFrom(volume, e, reason, clk))
			} else {
				kept = append(kept, e)
			}
		}
		if len(stale) == 0 {
			return true, nil
		}
		// Stale list first: a crash in between leaves an entry the cleaner
		// finds still held and drops, never a hold nobody undoes. The
		// clients are recorded before they are blocklisted, so that the
		// Unfencer takes off whatever landed.
		addrs := cephClients(&att, node)
		if len(addrs) > 0 && opts.Blocklister == nil {
			return true, fenceClients(ctx, nil, opts.Events, volume, node, reason, addrs) // says why; changes nothing
		}
		if err := addStale(ctx, c, clk, opts, node, stale, blocklisted(volume, addrs, reason, clk)); err != nil {
			return true, err
		}
		if len(addrs) > 0 {
			if err := fenceClients(ctx, opts.Blocklister, opts.Events, volume, node, reason, addrs); err != nil {
				return true, err
			}
		}
		moved = len(stale)
		return keepEntries(ctx, c, &att, kept, opts.exactLabels())
	})
	return moved, err
}
