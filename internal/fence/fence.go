// Package fence decides who may hold a volume. The Attachment object named
// after the volume lists the holders; fencing rides on the API server's
// optimistic concurrency: every decision is made on one read of the object
// and lands only if the object did not change meanwhile (create conflict or
// stale resourceVersion mean: read again, decide again).
//
// Holds that the access mode excludes are refused with a *ConflictError,
// unless the holder's node is gone, out of service, or its pod moved to the
// requesting node: then the hold is broken and moved to the node's
// stale-attachment list (NodeCleanup), which that node's agent undoes
// (Cleaner). Agents ask the operator to break locks (takeover.go); the
// operator's GC sweeps what nobody asked about.
package fence

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/go-logr/logr"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/record"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/berth-io/berth/api/v1alpha1"
	"github.com/berth-io/berth/internal/metrics"
	"github.com/berth-io/berth/internal/volerr"
)

// Options tune the optimistic-concurrency retries.
type Options struct {
	// MaxRetries bounds how often one call re-reads after losing a race
	// (default 20).
	MaxRetries int
	// Backoff is the first wait after a lost race, doubled per retry and
	// jittered (default 5ms).
	Backoff time.Duration
	// MaxBackoff caps the wait (default 500ms).
	MaxBackoff time.Duration
	// StaleListTTL is how long the GC keeps the stale list of a node whose
	// Node object is gone (default DefaultStaleListTTL).
	StaleListTTL time.Duration
	// Metrics, when set, counts the Fencer's decisions and lock breaks.
	Metrics *metrics.Fence
	// Blocklister fences the Ceph clients a node's Attachment status
	// records (cephClients) before its lock is broken. Without one, such a
	// lock is not broken (lock breaking fails with an error; the GC leaves
	// the entry for lock breaking by a process that has one).
	Blocklister Blocklister
	// Events tells on an Attachment why the GC leaves one of its entries
	// (nil: logged and counted only).
	Events record.EventRecorder
	// AskOperator makes Acquire ask the operator to break other nodes'
	// holds (a TakeOverRequest, takeover.go) instead of breaking them
	// itself: the agent's mode, whose word the admission policy does not
	// take for another node's liveness. It also keeps the node labels the
	// policy does not let an agent remove (setNodeLabels).
	AskOperator bool
	// TakeOverWait bounds how long Acquire waits for the operator
	// (default DefaultTakeOverWait).
	TakeOverWait time.Duration
}

// exactLabels: only a Fencer outside the agent's admission policy writes
// node labels exactly (setNodeLabels).
func (o Options) exactLabels() bool { return !o.AskOperator }

// DefaultStaleListTTL: a week, time for a node to be rebuilt under its name.
const DefaultStaleListTTL = 7 * 24 * time.Hour

func (o Options) withDefaults() Options {
	if o.MaxRetries <= 0 {
		o.MaxRetries = 20
	}
	if o.Backoff <= 0 {
		o.Backoff = 5 * time.Millisecond
	}
	if o.MaxBackoff <= 0 {
		o.MaxBackoff = 500 * time.Millisecond
	}
	if o.StaleListTTL <= 0 {
		o.StaleListTTL = DefaultStaleListTTL
	}
	if o.TakeOverWait <= 0 {
		o.TakeOverWait = DefaultTakeOverWait
	}
	return o
}

// Fencer grants and releases holds on volumes.
type Fencer struct {
	c    client.Client
	rec  record.EventRecorder
	clk  clock.Clock
	log  logr.Logger
	opts Options
}

// The agent fences through the API server (one GET per decision, a label
// list of its own holds) and checks the lock-breaking rules (GETs of nodes
// and pods) before it asks the operator to break a lock. The admission
// policy (deploy/berth/templates/agent-admission.yaml) narrows its writes
// to its own node's records; lock breaking and the GC are the operator's.
// +kubebuilder:rbac:groups=berth.io,resources=attachments,verbs=get;list;create;update;delete
// +kubebuilder:rbac:groups=berth.io,resources=attachments/status,verbs=get;update
// +kubebuilder:rbac:groups=berth.io,resources=nodecleanups,verbs=get;list;create;update
// +kubebuilder:rbac:groups=berth.io,resources=nodecleanups/status,verbs=get;update
// +kubebuilder:rbac:groups="",resources=nodes,verbs=get
// +kubebuilder:rbac:groups="",resources=pods,verbs=get
// +kubebuilder:rbac:groups="",resources=events,verbs=create;patch

// New returns a Fencer. c must read from the API server, not from a cache:
// a stale read could report a hold that was broken meanwhile as granted.
// rec gets an Event on the Attachment and the requesting pod for every
// refused request, and one on the Attachment for every lock broken.
func New(c client.Client, rec record.EventRecorder, clk clock.Clock, log logr.Logger, opts Options) *Fencer {
	return &Fencer{c: c, rec: rec, clk: clk, log: log, opts: opts.withDefaults()}
}

// Acquire records the request as a holder of its volume, or returns a
// *ConflictError naming the holder that excludes it. Asking again for a hold
// already granted returns nil.
func (f *Fencer) Acquire(ctx context.Context, req Request) error {
	start := f.clk.Now()
	err := req.validate()
	if err == nil {
		err = retry(ctx, f.clk, f.opts, "acquire "+req.Volume, func() (bool, error) {
			return f.tryAcquire(ctx, &req)
		})
		err = f.waitTakeOver(ctx, &req, err)
	}
	f.opts.Metrics.Acquired(acquireResult(err), f.clk.Since(start))
	return err
}

func acquireResult(err error) string {
	switch {
	case err == nil:
		return metrics.AcquireGranted
	case IsConflict(err):
		return metrics.AcquireConflict
	case errors.Is(err, volerr.ErrInvalid):
		return metrics.AcquireInvalid
	}
	return metrics.AcquireError
}

// tryAcquire makes one decision on one read. done=false asks for a re-read.
func (f *Fencer) tryAcquire(ctx context.Context, req *Request) (done bool, err error) {
	own := req.entry()
	var att v1.Attachment
	if err := f.c.Get(ctx, client.ObjectKey{Name: req.Volume}, &att); apierrors.IsNotFound(err) {
		att = v1.Attachment{
			ObjectMeta: metav1.ObjectMeta{Name: req.Volume},
			Spec:       v1.AttachmentSpec{AccessMode: req.AccessMode},
		}
		setEntries(&att, []v1.AttachmentEntry{own}, f.opts.exactLabels())
		if err := f.c.Create(ctx, &att); err != nil {
			return !raced(err), fmt.Errorf("create attachment %s: %w", req.Volume, err)
		}
		f.log.V(1).Info("fence acquired", "volume", req.Volume, "node", req.Node, "mountDir", req.MountDir, "created", true)
		return true, nil
	} else if err != nil {
		return true, fmt.Errorf("get attachment %s: %w", req.Volume, err)
	}
	if att.DeletionTimestamp != nil {
		// A hold added now would vanish with the object, or outlive it
		// for as long as someone's finalizer keeps it (F4).
		return true, fmt.Errorf("attachment %s (finalizers %v): %w", req.Volume, att.Finalizers, ErrTerminating)
	}

	others := make([]v1.AttachmentEntry, 0, len(att.Spec.Attachments)+1)
	for i := range att.Spec.Attachments {
		e := &att.Spec.Attachments[i]
		if !req.sameKey(e) {
			others = append(others, *e)
		} else if *e == own && att.Spec.AccessMode == req.AccessMode {
			return true, nil // already granted
		}
		// A different record in our own slot is replaced: only our node
		// writes entries for our node's paths.
	}

	if blocking, why := excluded(att.Spec.AccessMode, others, req); len(blocking) > 0 {
		broken, err := f.breakable(ctx, &att, blocking, req, why)
		if err != nil {
			return true, err
		}
		if f.opts.AskOperator {
			return f.askTakeOver(ctx, &att, req, broken)
		}
		if err := f.moveToStale(ctx, &att, broken, f.opts.Blocklister); err != nil {
			return true, err
		}
		others = without(others, broken)
	}
	if len(others) == 0 {
		att.Spec.AccessMode = req.AccessMode
	}
	setEntries(&att, append(others, own), f.opts.exactLabels())
	att.Spec.TakeOvers = withoutTakeOver(att.Spec.TakeOvers, req.Node, req.MountDir)
	if err := f.c.Update(ctx, &att); err != nil {
		return !raced(err), fmt.Errorf("update attachment %s: %w", req.Volume, err)
	}
	f.log.V(1).Info("fence acquired", "volume", req.Volume, "node", req.Node, "mountDir", req.MountDir)
	return true, nil
}

// Release removes the (node, mountDir) entry of the volume; the last release
// deletes the Attachment. Releasing what is not held returns nil.
func (f *Fencer) Release(ctx context.Context, volume, node, mountDir string) error {
	err := f.release(ctx, volume, node, mountDir)
	f.opts.Metrics.Released(err)
	return err
}

func (f *Fencer) release(ctx context.Context, volume, node, mountDir string) error {
	if volume == "" || node == "" || mountDir == "" {
		return fmt.Errorf("%w: release needs volume, node and mountDir (got %q, %q, %q)", volerr.ErrInvalid, volume, node, mountDir)
	}
	return retry(ctx, f.clk, f.opts, "release "+volume, func() (bool, error) {
		var att v1.Attachment
		if found, err := lookup(ctx, f.c, "attachment", client.ObjectKey{Name: volume}, &att); !found {
			return true, err
		}
		kept := att.Spec.Attachments[:0:0]
		for _, e := range att.Spec.Attachments {
			if e.Node != node || e.MountDir != mountDir {
				kept = append(kept, e)
			}
		}
		asks := withoutTakeOver(att.Spec.TakeOvers, node, mountDir)
		if len(kept) == len(att.Spec.Attachments) && len(asks) == len(att.Spec.TakeOvers) && len(kept) > 0 {
			return true, nil
		}
		att.Spec.TakeOvers = asks
		return keepEntries(ctx, f.c, &att, kept, f.opts.exactLabels())
	})
}

// keepEntries leaves att with only the kept entries: it updates att, or,
// with none left, deletes it if nobody wrote it since it was read. done
// false means a lost race: read again and retry.
func keepEntries(ctx context.Context, c client.Client, att *v1.Attachment, kept []v1.AttachmentEntry, exact bool) (done bool, err error) {
	if len(kept) == 0 {
		return deleteIfUnchanged(ctx, c, att)
	}
	setEntries(att, kept, exact)
	if err := c.Update(ctx, att); err != nil {
		return !raced(err), fmt.Errorf("update attachment %s: %w", att.Name, err)
	}
	return true, nil
}

// deleteIfUnchanged deletes obj only if nobody wrote it since it was read,
// so that a hold (or stale entry) written meanwhile is never deleted with it.
func deleteIfUnchanged(ctx context.Context, c client.Client, obj client.Object) (bool, error) {
	uid, rv := obj.GetUID(), obj.GetResourceVersion()
	err := c.Delete(ctx, obj, client.Preconditions{UID: &uid, ResourceVersion: &rv})
	if err == nil || apierrors.IsNotFound(err) {
		return true, nil
	}
	return !raced(err), fmt.Errorf("delete %s: %w", obj.GetName(), err)
}

// Holders returns the volume's holders and the mode they hold it under;
// none when the volume is not held.
func (f *Fencer) Holders(ctx context.Context, volume string) ([]v1.AttachmentEntry, v1.AccessMode, error) {
	var att v1.Attachment
	if found, err := lookup(ctx, f.c, "attachment", client.ObjectKey{Name: volume}, &att); !found {
		return nil, "", err
	}
	return att.Spec.Attachments, att.Spec.AccessMode, nil
}

// Hold is one entry of a node, with the volume it holds.
type Hold struct {
	Volume string
	Mode   v1.AccessMode
	Entry  v1.AttachmentEntry
}

// lookup reads obj; found is false when it does not exist.
func lookup(ctx context.Context, c client.Client, what string, key client.ObjectKey, obj client.Object) (found bool, err error) {
	err = c.Get(ctx, key, obj)
	switch {
	case apierrors.IsNotFound(err):
		return false, nil
	case err != nil:
		name := key.Name
		if key.Namespace != "" {
			name = key.String()
		}
		return false, fmt.Errorf("get %s %s: %w", what, name, err)
	}
	return true, nil
}

// raced tells whether err means "someone wrote first": read again, decide again.
func raced(err error) bool {
	return apierrors.IsConflict(err) || apierrors.IsAlreadyExists(err) || apierrors.IsNotFound(err)
}

// retry runs op until it is done, at most opts.MaxRetries+1 times, with a
// jittered exponential backoff between lost races.
func retry(ctx context.Context, clk clock.Clock, opts Options, what string, op func() (bool, error)) error {
	wait := opts.Backoff
	var last error
	for attempt := 0; attempt <= opts.MaxRetries; attempt++ {
		done, err := op()
		if done {
			return err
		}
		last = err
		d := wait/2 + rand.N(wait) // jitter in [wait/2, 3*wait/2)
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s: %w (last: %w)", what, ctx.Err(), last)
		case <-clk.After(d):
		}
		wait = min(2*wait, opts.MaxBackoff)
	}
	return fmt.Errorf("%w: %s after %d attempts: %w", ErrTooManyRetries, what, opts.MaxRetries+1, last)
}

// IsConflict tells whether err carries a *ConflictError.
func IsConflict(err error) bool {
	var ce *ConflictError
	return errors.As(err, &ce)
}
