package share_test

import (
	"context"
	"errors"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	coordclient "k8s.io/client-go/kubernetes/typed/coordination/v1"
	"k8s.io/utils/clock"
	"k8s.io/utils/ptr"

	v1 "github.com/berth-io/berth/api/v1alpha1"
	"github.com/berth-io/berth/internal/share"
	"github.com/berth-io/berth/internal/testenv"
)

var suite = &testenv.Suite{}

func TestMain(m *testing.M) { os.Exit(testenv.Main(m, suite)) }

func leases(t *testing.T) *kubernetes.Clientset {
	env := suite.Require(t)
	cs, err := kubernetes.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	return cs
}

func newLease(t *testing.T, cs *kubernetes.Clientset, name, holder string, d time.Duration) *share.Lease {
	t.Helper()
	l, err := share.NewLease(share.LeaseConfig{Namespace: "default", Name: name, Holder: holder, Duration: d},
		cs.CoordinationV1(), clock.RealClock{}, testr.New(t))
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func getLease(t *testing.T, cs *kubernetes.Clientset, name string) *coordinationv1.Lease {
	t.Helper()
	l, err := cs.CoordinationV1().Leases("default").Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// A share manager creates its Lease, renews it while it runs and clears
// the holder when it stops cleanly.
func TestLeaseRenewedThenReleased(t *testing.T) {
	cs := leases(t)
	ctx := context.Background()
	l := newLease(t, cs, "share-renew", "pod-a", 3*time.Second)
	if err := l.Acquire(ctx); err != nil {
		t.Fatal(err)
	}
	first := getLease(t, cs, "share-renew")
	if h := ptr.Deref(first.Spec.HolderIdentity, ""); h != "pod-a" {
		t.Fatalf("holder %q", h)
	}
	rctx, cancel := context.WithTimeout(ctx, 2500*time.Millisecond)
	defer cancel()
	if err := l.Renew(rctx); err != nil {
		t.Fatalf("Renew = %v", err)
	}
	renewed := getLease(t, cs, "share-renew")
	if !renewed.Spec.RenewTime.After(first.Spec.RenewTime.Time) {
		t.Errorf("renew time %v not after %v", renewed.Spec.RenewTime, first.Spec.RenewTime)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if h := getLease(t, cs, "share-renew").Spec.HolderIdentity; h != nil {
		t.Errorf("holder %q after release", *h)
	}
}

// A new share manager waits for the old one's lease to lapse, then takes
// it over; the old one, renewing again, learns it lost the lease.
func TestLeaseTakenOverOnlyAfterLapse(t *testing.T) {
	cs := leases(t)
	ctx := context.Background()
	old := newLease(t, cs, "share-takeover", "pod-old", 2*time.Second)
	if err := old.Acquire(ctx); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	next := newLease(t, cs, "share-takeover", "pod-new", 2*time.Second)
	if err := next.Acquire(ctx); err != nil {
		t.Fatal(err)
	}
	if waited := time.Since(start); waited < 2*time.Second {
		t.Errorf("took the lease over after %s, before it lapsed (2s)", waited)
	}
	got := getLease(t, cs, "share-takeover")
	if h := ptr.Deref(got.Spec.HolderIdentity, ""); h != "pod-new" || ptr.Deref(got.Spec.LeaseTransitions, 0) != 1 {
		t.Errorf("holder %q transitions %d", h, ptr.Deref(got.Spec.LeaseTransitions, 0))
	}
	rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := old.Renew(rctx); !errors.Is(err, share.ErrLeaseLost) {
		t.Errorf("old holder's Renew = %v, want ErrLeaseLost", err)
	}
	// Releasing a lease another holds changes nothing.
	if err := old.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if h := ptr.Deref(getLease(t, cs, "share-takeover").Spec.HolderIdentity, ""); h != "pod-new" {
		t.Errorf("holder %q after the old holder's release", h)
	}
}

// The same holder (a restarted share manager process in the same pod)
// takes its own lease back at once.
func TestLeaseSameHolderReacquiresAtOnce(t *testing.T) {
	cs := leases(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if err := newLease(t, cs, "share-same", "pod-a", 10*time.Second).Acquire(ctx); err != nil {
		t.Fatal(err)
	}
	if err := newLease(t, cs, "share-same", "pod-a", 10*time.Second).Acquire(ctx); err != nil {
		t.Fatalf("same holder waited: %v", err)
	}
}

// What the share manager reports (Annotate) reaches its Lease with the
// next renewal, and a later report replaces it.
func TestLeaseRenewalCarriesAnnotations(t *testing.T) {
	cs := leases(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	l := newLease(t, cs, "share-annotate", "pod-a", 3*time.Second)
	if err := l.Acquire(ctx); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- l.Renew(ctx) }()
	for _, size := range []string{"536870912", "1073741824"} {
		l.Annotate(v1.ShareSizeAnnotation, size)
		deadline := time.Now().Add(5 * time.Second)
		for getLease(t, cs, "share-annotate").Annotations[v1.ShareSizeAnnotation] != size {
			if time.Now().After(deadline) {
				t.Fatalf("the Lease has annotations %v, want the size %s", getLease(t, cs, "share-annotate").Annotations, size)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// What the controller saw of the old holder's Lease (SeenVersion for
// SeenFor) counts toward its lapse: seen for a whole Duration, the Lease
// is taken over at once; seen for part of it, after the rest (not at the
// next renewal tick); a version the old holder has renewed since counts
// nothing, and the new holder waits a whole Duration.
func TestLeaseTakeoverCountsTheControllersSighting(t *testing.T) {
	cs := leases(t)
	ctx := context.Background()
	const d = 3 * time.Second
	for _, c := range []struct {
		name          string
		seenFor       time.Duration
		renewedSince  bool
		least, before time.Duration
	}{
		{name: "lapsed", seenFor: d, least: 0, before: time.Second},
		{name: "partly", seenFor: d - 1500*time.Millisecond, least: 1400 * time.Millisecond, before: 2500 * time.Millisecond},
		{name: "renewed", seenFor: d, renewedSince: true, least: d, before: d + 2*time.Second},
	} {
		t.Run(c.name, func(t *testing.T) {
			name := "share-seen-" + c.name
			old := newLease(t, cs, name, "pod-old", d)
			if err := old.Acquire(ctx); err != nil {
				t.Fatal(err)
			}
			seen := getLease(t, cs, name).ResourceVersion
			if c.renewedSince {
				// The old holder took its own Lease again: a renewal.
				if err := newLease(t, cs, name, "pod-old", d).Acquire(ctx); err != nil {
					t.Fatal(err)
				}
			}
			next, err := share.NewLease(share.LeaseConfig{Namespace: "default", Name: name, Holder: "pod-new", Duration: d,
				SeenVersion: seen, SeenFor: c.seenFor}, cs.CoordinationV1(), clock.RealClock{}, testr.New(t))
			if err != nil {
				t.Fatal(err)
			}
			start := time.Now()
			if err := next.Acquire(ctx); err != nil {
				t.Fatal(err)
			}
			if waited := time.Since(start); waited < c.least || waited >= c.before {
				t.Errorf("took the Lease over after %s, want from %s to %s", waited, c.least, c.before)
			}
			if h := ptr.Deref(getLease(t, cs, name).Spec.HolderIdentity, ""); h != "pod-new" {
				t.Errorf("holder %q", h)
			}
		})
	}
}

// hangingLeases passes Lease requests to the API server until cut, then
// holds each until its context ends: an API server the holder no longer
// reaches (a partition), with requests that hang rather than fail.
type hangingLeases struct {
	coordclient.LeasesGetter
	cut atomic.Bool
}

func (h *hangingLeases) Leases(ns string) coordclient.LeaseInterface {
	return hangingLease{h.LeasesGetter.Leases(ns), &h.cut}
}

type hangingLease struct {
	coordclient.LeaseInterface
	cut *atomic.Bool
}

func (h hangingLease) Get(ctx context.Context, name string, o metav1.GetOptions) (*coordinationv1.Lease, error) {
	if h.cut.Load() {
		<-ctx.Done()
		return nil, ctx.Err()
	}
	return h.LeaseInterface.Get(ctx, name, o)
}

// A holder cut off from the API server gives its Lease up a Duration after
// its last renewal was sent, even while a renewal hangs (its APITimeout is
// longer): no later than a new holder may take the Lease over.
func TestLeaseHolderGivesUpAtTheLapseWhenRequestsHang(t *testing.T) {
	cs := leases(t)
	const d = 2 * time.Second
	h := &hangingLeases{LeasesGetter: cs.CoordinationV1()}
	l, err := share.NewLease(share.LeaseConfig{Namespace: "default", Name: "share-hang", Holder: "pod-a", Duration: d, APITimeout: 10 * time.Second},
		h, clock.RealClock{}, testr.New(t))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := l.Acquire(ctx); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- l.Renew(ctx) }()
	time.Sleep(time.Second)
	h.cut.Store(true)
	cut := time.Now()
	err = <-done
	if !errors.Is(err, share.ErrLeaseLost) {
		t.Fatalf("Renew = %v, want ErrLeaseLost", err)
	}
	// The last renewal that got through was sent before the cut.
	if after := time.Since(cut); after > d+300*time.Millisecond {
		t.Errorf("gave the Lease up %s after the cut, more than its %s", after, d)
	}
}
