package fence

import (
	"context"
	"fmt"
	"slices"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/record"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/berth-io/berth/api/v1alpha1"
	"github.com/berth-io/berth/internal/volerr"
)

// Blocklister fences Ceph clients (ceph.Fencing): a lock broken on a Ceph
// volume is not enough, since the node that lost it may be cut off but
// still running, with the image mapped; Ceph must refuse its writes before
// another node maps the image.
type Blocklister interface {
	// FenceClients puts addrs on Ceph's blocklist and breaks the image
	// lock they hold on volume. Doing it again is no error.
	FenceClients(ctx context.Context, volume string, addrs []string) error
	// UnfenceClients takes addrs off Ceph's blocklist; an address not on it
	// is no error.
	UnfenceClients(ctx context.Context, addrs []string) error
}

// Event reasons of fencing on the data path.
const (
	EventBlocklisted     = "FenceBlocklisted"
	EventBlocklistFailed = "FenceBlocklistFailed"
)

// cephClients are the Ceph client addresses att's status records for node
// (the servers that serve the volume there).
func cephClients(att *v1.Attachment, node string) []string {
	for _, n := range att.Status.Nodes {
		if n.Node == node {
			return n.CephClients
		}
	}
	return nil
}

// blocklisted is how a node's fenced clients are recorded on its stale list.
func blocklisted(volume string, addrs []string, reason v1.CleanupReason, clk clock.PassiveClock) []v1.BlocklistedClient {
	out := make([]v1.BlocklistedClient, 0, len(addrs))
	for _, a := range addrs {
		out = append(out, v1.BlocklistedClient{Address: a, Volume: volume, Reason: reason, BlocklistedAt: metav1.NewTime(clk.Now())})
	}
	return out
}

// fenceClients blocklists node's Ceph clients on volume (recorded on the
// node's stale list beforehand, so that whatever lands is taken off again).
// Without a Blocklister the lock must not be broken: an error. rec, when
// set, gets an Event on the Attachment either way.
func fenceClients(ctx context.Context, bl Blocklister, rec record.EventRecorder, volume, node string, reason v1.CleanupReason, addrs []string) error {
	var err error
	if bl == nil {
		err = fmt.Errorf("%w: volume %s: node %s's Ceph clients %v must be blocklisted before its lock is broken, and this process has no Ceph access",
			volerr.ErrUnavailable, volume, node, addrs)
	} else if err = bl.FenceClients(ctx, volume, addrs); err != nil {
		err = fmt.Errorf("%w: volume %s: blocklist node %s's Ceph clients %v (%s); its lock stays until that succeeds: %w",
			volerr.ErrUnavailable, volume, node, addrs, reason, err)
	}
	if rec != nil {
		if err != nil {
			rec.Eventf(attachmentRef(volume, ""), corev1.EventTypeWarning, EventBlocklistFailed, "%v", err)
		} else {
			rec.Eventf(attachmentRef(volume, ""), corev1.EventTypeWarning, EventBlocklisted,
				"blocklisted node %s's Ceph clients %v before taking its lock over: %s", node, addrs, reason)
		}
	}
	return err
}

// mergeBlocklisted adds recs to list; an address already listed keeps its
// first record (the blocklisting it records still holds).
func mergeBlocklisted(list []v1.BlocklistedClient, recs []v1.BlocklistedClient) ([]v1.BlocklistedClient, bool) {
	changed := false
	for _, r := range recs {
		if !slices.ContainsFunc(list, func(b v1.BlocklistedClient) bool { return b.Address == r.Address }) {
			list = append(list, r)
			changed = true
		}
	}
	return list, changed
}

// backAndClean tells whether the node is back and its stale list worked off
// by a pass of its agent after the last blocklisting; why says what is not.
func backAndClean(ctx context.Context, c client.Client, nc *v1.NodeCleanup) (bool, string, error) {
	var n corev1.Node
	if err := c.Get(ctx, client.ObjectKey{Name: nc.Name}, &n); apierrors.IsNotFound(err) {
		return false, "node object gone", nil
	} else if err != nil {
		return false, "", fmt.Errorf("get node %s: %w", nc.Name, err)
	}
	if OutOfService(&n) {
		return false, "tainted out-of-service", nil
	}
	if !nodeReady(&n) {
		return false, "node not Ready", nil
	}
	if len(nc.Spec.Entries) > 0 {
		return false, fmt.Sprintf("%d stale entries left", len(nc.Spec.Entries)), nil
	}
	last := nc.Spec.Blocklisted[0].BlocklistedAt
	for _, b := range nc.Spec.Blocklisted {
		if last.Before(&b.BlocklistedAt) {
			last = b.BlocklistedAt
		}
	}
	lp := nc.Status.LastProcessed
	if lp == nil || lp.Before(&last) || !meta.IsStatusConditionTrue(nc.Status.Conditions, v1.ConditionReady) {
		return false, "no clean pass of the node's agent since the blocklisting", nil
	}
	return true, "", nil
}

func nodeReady(n *corev1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}
