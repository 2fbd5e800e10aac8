package share

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/go-logr/logr"
	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	coordclient "k8s.io/client-go/kubernetes/typed/coordination/v1"
	"k8s.io/utils/clock"
	"k8s.io/utils/ptr"
)

// LeaseConfig names the coordination.k8s.io Lease a share manager renews:
// the controller reads a lapsed lease as a dead share manager.
type LeaseConfig struct {
	Namespace, Name, Holder string
	// Duration is the lease's length; RenewInterval the time between
	// renewals (default Duration/3); APITimeout bounds one request.
	Duration, RenewInterval, APITimeout time.Duration
	// SeenVersion and SeenFor are what the controller that made this
	// process knew: it had seen the Lease at resourceVersion SeenVersion,
	// unchanged, for SeenFor by its own clock before it did. Acquire counts
	// that time toward the lapse (see Acquire); empty: nothing known.
	SeenVersion string
	SeenFor     time.Duration
}

func (c LeaseConfig) withDefaults() LeaseConfig {
	if c.Duration == 0 {
		c.Duration = 15 * time.Second
	}
	if c.RenewInterval == 0 {
		c.RenewInterval = c.Duration / 3
	}
	if c.APITimeout == 0 {
		c.APITimeout = 5 * time.Second
	}
	return c
}

// ErrLeaseLost: the lease could not be renewed within its duration, or
// another holder took it. The share manager stops serving.
var ErrLeaseLost = errors.New("share lease lost")

// Lease holds one Lease.
type Lease struct {
	cfg    LeaseConfig
	leases coordclient.LeasesGetter
	clk    clock.WithTicker
	log    logr.Logger

	mu    sync.Mutex
	notes map[string]string // annotations the next renewal writes
	// renewed is when the last write that took or renewed the Lease was
	// sent (before it landed): the holder's lapse counts from there.
	renewed time.Time
}

// NewLease returns a holder of cfg's Lease through c.
func NewLease(cfg LeaseConfig, c coordclient.LeasesGetter, clk clock.WithTicker, log logr.Logger) (*Lease, error) {
	cfg = cfg.withDefaults()
	if cfg.Namespace == "" || cfg.Name == "" || cfg.Holder == "" {
		return nil, errors.New("lease needs a namespace, a name and a holder")
	}
	if cfg.RenewInterval >= cfg.Duration {
		return nil, fmt.Errorf("lease renew interval %s must be shorter than its duration %s", cfg.RenewInterval, cfg.Duration)
	}
	return &Lease{cfg: cfg, leases: c, clk: clk, log: log.WithValues("lease", cfg.Namespace+"/"+cfg.Name)}, nil
}

// Acquire takes the Lease: creates it, renews it when this holder has it,
// takes it over once another holder has not renewed it for Duration, and
// otherwise waits until ctx ends.
//
// "Not renewed for Duration" is measured without trusting any clock's
// time of day, only clocks' rates: from the moment a resourceVersion was
// first seen. Seen by this process, or by the controller that made it
// (SeenVersion, SeenFor): its sighting was made before this process
// started, so the version was unchanged for at least SeenFor when Acquire
// starts, and every moment since adds to that. Without the controller's
// sighting a replacement waits a whole Duration more after the controller
// already saw the old holder lapse. The takeover itself is an update at
// the seen resourceVersion, so a renewal that raced it makes it fail.
func (l *Lease) Acquire(ctx context.Context) error {
	seenVersion, seenAt := "", time.Time{}
	if l.cfg.SeenVersion != "" {
		seenVersion, seenAt = l.cfg.SeenVersion, l.clk.Now().Add(-l.cfg.SeenFor)
	}
	for {
		done, err := l.tryAcquire(ctx, &seenVersion, &seenAt)
		if done {
			return nil
		}
		if err != nil {
			l.log.Info("acquiring the lease", "err", err.Error())
		}
		// Look again after RenewInterval, or right when the version seen
		// would lapse if that is sooner: a takeover is not put off to the
		// next renewal tick.
		wait := l.cfg.RenewInterval
		if seenVersion != "" {
			if left := l.cfg.Duration - l.clk.Since(seenAt); left > 0 && left < wait {
				wait = left
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("acquire lease %s/%s: %w", l.cfg.Namespace, l.cfg.Name, ctx.Err())
		case <-l.clk.After(wait):
		}
	}
}

func (l *Lease) tryAcquire(ctx context.Context, seenVersion *string, seenAt *time.Time) (bool, error) {
	ctx, cancel := context.WithTimeout(ctx, l.cfg.APITimeout)
	defer cancel()
	cur, err := l.leases.Leases(l.cfg.Namespace).Get(ctx, l.cfg.Name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		sent := l.clk.Now()
		now := metav1.NewMicroTime(sent)
		_, err = l.leases.Leases(l.cfg.Namespace).Create(ctx, &coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{Namespace: l.cfg.Namespace, Name: l.cfg.Name},
			Spec: coordinationv1.LeaseSpec{
				HolderIdentity:       ptr.To(l.cfg.Holder),
				LeaseDurationSeconds: ptr.To(l.durationSeconds()),
				AcquireTime:          &now,
				RenewTime:            &now,
			},
		}, metav1.CreateOptions{})
		if err == nil {
			l.setRenewed(sent)
			l.log.Info("lease created", "holder", l.cfg.Holder)
		}
		return err == nil, err
	}
	if err != nil {
		return false, err
	}
	holder := ptr.Deref(cur.Spec.HolderIdentity, "")
	if holder != "" && holder != l.cfg.Holder {
		if cur.ResourceVersion != *seenVersion {
			*seenVersion, *seenAt = cur.ResourceVersion, l.clk.Now()
			l.log.Info("lease held by another holder; waiting for it to lapse", "holder", holder, "duration", l.cfg.Duration.String())
			return false, nil
		}
		if l.clk.Since(*seenAt) < l.cfg.Duration {
			l.log.V(1).Info("lease held by another holder, not lapsed yet", "holder", holder, "unchangedFor", l.clk.Since(*seenAt).String())
			return false, nil
		}
		l.log.Info("taking over a lapsed lease", "from", holder, "unchangedFor", l.clk.Since(*seenAt).String())
	}
	sent := l.clk.Now()
	now := metav1.NewMicroTime(sent)
	if holder != l.cfg.Holder {
		cur.Spec.AcquireTime = &now
		cur.Spec.LeaseTransitions = ptr.To(ptr.Deref(cur.Spec.LeaseTransitions, 0) + 1)
	}
	cur.Spec.HolderIdentity = ptr.To(l.cfg.Holder)
	cur.Spec.LeaseDurationSeconds = ptr.To(l.durationSeconds())
	cur.Spec.RenewTime = &now
	if _, err := l.leases.Leases(l.cfg.Namespace).Update(ctx, cur, metav1.UpdateOptions{}); err != nil {
		return false, err
	}
	l.setRenewed(sent)
	l.log.Info("lease acquired", "holder", l.cfg.Holder)
	return true, nil
}

func (l *Lease) durationSeconds() int32 {
	return int32((l.cfg.Duration + time.Second - 1) / time.Second)
}

// Renew renews the lease every RenewInterval until ctx ends (nil) or the
// lease is lost (ErrLeaseLost): another holder has it now, or it was not
// renewed for Duration. That Duration counts from when the last successful
// renewal was sent, and a renewal still under way then is given up: the
// write landed after it was sent, so whoever saw it (a new holder, or the
// controller for it, see Acquire) can take the Lease over no sooner than
// this holder gives up.
func (l *Lease) Renew(ctx context.Context) error {
	tick := l.clk.NewTicker(l.cfg.RenewInterval)
	defer tick.Stop()
	lost := func(last time.Time, err error) error {
		if err == nil {
			return fmt.Errorf("%w: not renewed for %s", ErrLeaseLost, l.clk.Since(last).Round(time.Millisecond))
		}
		return fmt.Errorf("%w: not renewed for %s: %w", ErrLeaseLost, l.clk.Since(last).Round(time.Millisecond), err)
	}
	for {
		last := l.lastRenewed()
		left := l.cfg.Duration - l.clk.Since(last)
		if left <= 0 {
			return lost(last, nil)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-l.clk.After(left):
			return lost(last, nil)
		case <-tick.C():
		}
		sent := l.clk.Now()
		rctx, cancel := context.WithTimeout(ctx, l.cfg.Duration-l.clk.Since(last))
		err := l.renew(rctx)
		cancel()
		switch {
		case err == nil:
			l.setRenewed(sent)
		case errors.Is(err, ErrLeaseLost):
			return err
		case ctx.Err() != nil:
			return nil
		case l.clk.Since(last) >= l.cfg.Duration:
			return lost(last, err)
		default:
			l.log.Info("lease renewal failed; retrying", "err", err.Error(), "sinceRenewal", l.clk.Since(last).String())
		}
	}
}

func (l *Lease) setRenewed(t time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.renewed = t
}

// lastRenewed is when the last successful write was sent; before any,
// now (Renew without Acquire: a holder that took the Lease some other way).
func (l *Lease) lastRenewed() time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.renewed.IsZero() {
		l.renewed = l.clk.Now()
	}
	return l.renewed
}

func (l *Lease) renew(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, l.cfg.APITimeout)
	defer cancel()
	cur, err := l.leases.Leases(l.cfg.Namespace).Get(ctx, l.cfg.Name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return fmt.Errorf("%w: the lease was deleted", ErrLeaseLost)
	}
	if err != nil {
		return err
	}
	if h := ptr.Deref(cur.Spec.HolderIdentity, ""); h != l.cfg.Holder {
		return fmt.Errorf("%w: held by %q now", ErrLeaseLost, h)
	}
	now := metav1.NewMicroTime(l.clk.Now())
	cur.Spec.RenewTime = &now
	l.mu.Lock()
	for k, v := range l.notes {
		if cur.Annotations == nil {
			cur.Annotations = map[string]string{}
		}
		cur.Annotations[k] = v
	}
	l.mu.Unlock()
	_, err = l.leases.Leases(l.cfg.Namespace).Update(ctx, cur, metav1.UpdateOptions{})
	return err
}

// Annotate sets an annotation that the next renewal writes on the Lease:
// the share manager's reports reach the controller this way, with no
// write to any other object and no request of their own.
func (l *Lease) Annotate(key, value string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.notes == nil {
		l.notes = map[string]string{}
	}
	l.notes[key] = value
}

// Release clears the holder when this process still holds the lease, so
// that the controller sees a clean stop at once instead of a lapse.
func (l *Lease) Release(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, l.cfg.APITimeout)
	defer cancel()
	cur, err := l.leases.Leases(l.cfg.Namespace).Get(ctx, l.cfg.Name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return err
	}
	if ptr.Deref(cur.Spec.HolderIdentity, "") != l.cfg.Holder {
		return nil
	}
	cur.Spec.HolderIdentity = nil
	if _, err := l.leases.Leases(l.cfg.Namespace).Update(ctx, cur, metav1.UpdateOptions{}); err != nil {
		return err
	}
	l.log.Info("lease released")
	return nil
}
