package fence

import (
	"context"
	"errors"
	"fmt"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/berth-io/berth/api/v1alpha1"
)

// Lock breaking by the operator (F4). An agent's word that another node
// is gone, out of service, or lost its pod to this node is not proof: a
// compromised agent could say so of a live node and make two honest nodes
// write one Ceph image. So an agent with Options.AskOperator never
// removes another node's holds. Where its own reading of the rules says
// the holds may be broken, it adds a TakeOverRequest to the Attachment and
// waits; the operator (ServeTakeOvers) reads the Node and Pod objects
// itself, fences the holder's Ceph clients with its own key, moves the
// holds to the holder's stale list and removes them. The agent then
// acquires as if nobody had held the volume. The admission policy lets
// agents write only their own node's requests.

const (
	// DefaultTakeOverWait bounds how long an agent waits for the operator
	// before it returns a conflict (kubelet retries the stage or publish,
	// which renews the request).
	DefaultTakeOverWait = 30 * time.Second
	// takeOverPoll is how often a waiting agent reads the Attachment.
	takeOverPoll = 250 * time.Millisecond
	// takeOverRenew: a waiting agent renews an older request, so that the
	// operator's expiry drops only requests nobody waits for.
	takeOverRenew = time.Minute
	// TakeOverExpiry: the operator drops requests older than this.
	TakeOverExpiry = 10 * time.Minute
	// TakeOverRecheck is how often the operator checks the rules again for
	// a request they refused (a taint or a pod may come later).
	TakeOverRecheck = 3 * time.Second
)

// takeOverAsked says the agent asked the operator to break holder's holds.
type takeOverAsked struct {
	holder v1.AttachmentEntry
	reason v1.CleanupReason
}

func (e *takeOverAsked) Error() string {
	return fmt.Sprintf("asked the operator to break the holds of node %s (%s)", e.holder.Node, e.reason)
}

// askTakeOver records req as a take-over request on att (renewing an old
// one) instead of breaking the holds itself.
func (f *Fencer) askTakeOver(ctx context.Context, att *v1.Attachment, req *Request, bs []broken) (done bool, err error) {
	asked := &takeOverAsked{holder: bs[0].entries[0], reason: bs[0].reason}
	want := v1.TakeOverRequest{AttachmentEntry: req.entry(), AccessMode: req.AccessMode, SoleDevice: req.SoleDevice}
	for _, r := range att.Spec.TakeOvers {
		if r.Node == want.Node && r.MountDir == want.MountDir {
			want.RequestedAt = r.RequestedAt
			if r == want && f.clk.Since(r.RequestedAt.Time) < takeOverRenew {
				return true, asked
			}
		}
	}
	want.RequestedAt = metav1.NewTime(f.clk.Now().Truncate(time.Second))
	att.Spec.TakeOvers = append(withoutTakeOver(att.Spec.TakeOvers, req.Node, req.MountDir), want)
	if err := f.c.Update(ctx, att); err != nil {
		return !raced(err), fmt.Errorf("update attachment %s: %w", att.Name, err)
	}
	f.log.Info("asked the operator to break holds", "volume", att.Name, "node", req.Node, "mountDir", req.MountDir,
		"holder", asked.holder.Node, "reason", asked.reason)
	return true, asked
}

// waitTakeOver re-runs the acquisition until the operator broke the holds
// (or the request is refused outright), for at most TakeOverWait.
func (f *Fencer) waitTakeOver(ctx context.Context, req *Request, err error) error {
	start := f.clk.Now()
	for {
		var asked *takeOverAsked
		if !errors.As(err, &asked) {
			return err
		}
		if f.clk.Since(start) >= f.opts.TakeOverWait {
			return &ConflictError{Volume: req.Volume, Mode: req.AccessMode, Holder: asked.holder,
				Reason: fmt.Sprintf("waited %s for the operator to break its holds (%s); the request stays for the operator, and the next try renews it",
					f.opts.TakeOverWait, asked.reason)}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("acquire %s: %w (%w)", req.Volume, ctx.Err(), err)
		case <-f.clk.After(takeOverPoll):
		}
		err = retry(ctx, f.clk, f.opts, "acquire "+req.Volume, func() (bool, error) {
			return f.tryAcquire(ctx, req)
		})
	}
}

// withoutTakeOver drops the request of the (node, mountDir) slot.
func withoutTakeOver(rs []v1.TakeOverRequest, node, mountDir string) []v1.TakeOverRequest {
	out := rs[:0:0]
	for _, r := range rs {
		if r.Node != node || r.MountDir != mountDir {
			out = append(out, r)
		}
	}
	return out
}

// BlocklisterFor returns the Blocklister that fences the Ceph clients of
// a volume, or nil for a volume that has none (not on Ceph).
type BlocklisterFor func(ctx context.Context, volume string) (Blocklister, error)

// ServeTakeOvers is the operator's side: it checks each take-over request
// on the volume's Attachment against the lock-breaking rules and, where
// they allow it, fences and removes the holds that block it. It drops
// expired requests. pending tells whether requests remain (the caller
// checks again after TakeOverRecheck).
func (f *Fencer) ServeTakeOvers(ctx context.Context, volume string, blocklisterFor BlocklisterFor) (pending bool, err error) {
	// Each pass changes at most one thing and asks for another (again);
	// lost races are retried with backoff.
	for range 2*maxTakeOvers + 2 {
		var again bool
		err = retry(ctx, f.clk, f.opts, "serve take-overs of "+volume, func() (bool, error) {
			var done bool
			done, again, pending, err = f.serveTakeOvers(ctx, volume, blocklisterFor)
			return done, err
		})
		if err != nil || !again {
			return pending, err
		}
	}
	return true, nil
}

// maxTakeOvers is the API's bound on an Attachment's requests.
const maxTakeOvers = 64

// serveTakeOvers makes one change: it drops expired requests, or breaks
// the holds that block one request. again asks for another pass.
func (f *Fencer) serveTakeOvers(ctx context.Context, volume string, blocklisterFor BlocklisterFor) (done, again, pending bool, err error) {
	var att v1.Attachment
	if err := f.c.Get(ctx, client.ObjectKey{Name: volume}, &att); apierrors.IsNotFound(err) {
		return true, false, false, nil
	} else if err != nil {
		return true, false, true, fmt.Errorf("get attachment %s: %w", volume, err)
	}
	if len(att.Spec.TakeOvers) == 0 || att.DeletionTimestamp != nil {
		return true, false, false, nil
	}
	kept := att.Spec.TakeOvers[:0:0]
	for _, r := range att.Spec.TakeOvers {
		if f.clk.Since(r.RequestedAt.Time) < TakeOverExpiry {
			kept = append(kept, r)
		} else {
			f.log.Info("take-over request expired", "volume", volume, "node", r.Node, "mountDir", r.MountDir)
		}
	}
	if len(kept) != len(att.Spec.TakeOvers) {
		att.Spec.TakeOvers = kept
		if len(kept) == 0 && len(att.Spec.Attachments) == 0 {
			// Its holds were broken for a request nobody came back for.
			done, err := deleteIfUnchanged(ctx, f.c, &att)
			return done, false, false, err
		}
		if err := f.c.Update(ctx, &att); err != nil {
			return !raced(err), false, true, fmt.Errorf("update attachment %s: %w", volume, err)
		}
		return true, true, true, nil
	}
	var bl Blocklister
	if blocklisterFor != nil {
		if bl, err = blocklisterFor(ctx, volume); err != nil {
			return true, false, true, fmt.Errorf("volume %s: %w", volume, err)
		}
	}
	for _, r := range att.Spec.TakeOvers {
		req := &Request{Volume: volume, Node: r.Node, PodNamespace: r.PodNamespace, Pod: r.Pod, PodUID: r.PodUID,
			MountDir: r.MountDir, StagingPath: r.StagingPath, AccessMode: r.AccessMode, ReadOnly: r.ReadOnly,
			SoleDevice: r.SoleDevice, Ceph: bl != nil}
		if err := req.validate(); err != nil {
			continue // the API's schema admits what validate refuses only for ReadOnlyMany; the agent's next try says why
		}
		others := make([]v1.AttachmentEntry, 0, len(att.Spec.Attachments))
		for i := range att.Spec.Attachments {
			if !req.sameKey(&att.Spec.Attachments[i]) {
				others = append(others, att.Spec.Attachments[i])
			}
		}
		blocking, why := excluded(att.Spec.AccessMode, others, req)
		if len(blocking) == 0 {
			continue // nothing to break: the agent acquires on its own
		}
		bs, err := f.breakable(ctx, &att, blocking, req, why)
		if IsConflict(err) {
			continue // the rules do not allow it (yet)
		} else if err != nil {
			return true, false, true, err
		}
		if err := f.moveToStale(ctx, &att, bs, bl); err != nil {
			return true, false, true, err
		}
		setEntries(&att, without(att.Spec.Attachments, bs), f.opts.exactLabels())
		if err := f.c.Update(ctx, &att); err != nil {
			return !raced(err), false, true, fmt.Errorf("update attachment %s: %w", volume, err)
		}
		return true, true, true, nil // the other requests on a fresh read
	}
	return true, false, true, nil
}
