package capacity

import (
	"cmp"
	"context"
	"time"

	"github.com/go-logr/logr"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	v1 "github.com/berth-io/berth/api/v1alpha1"
)

// Schedule is when a publisher publishes: at start, every Interval, and at
// once when a berth StorageClass is added or changed. Without the latter
// the first pod of a new WaitForFirstConsumer class waits up to an
// Interval for a capacity, as the scheduler places no such volume before.
type Schedule struct {
	// Classes is where StorageClasses are watched (an informer); nil
	// watches nothing: every Interval only.
	Classes  kubernetes.Interface
	Interval time.Duration
	// Timeout bounds one round (default 30s).
	Timeout time.Duration
}

// RoundTimeout is how long one round may take.
func (s Schedule) RoundTimeout() time.Duration { return cmp.Or(s.Timeout, 30*time.Second) }

// Run runs round now, then on s, until ctx ends (interval, when s has
// none). A round that returns soon runs again within a second: it found
// nothing to publish yet; one that also failed, after a wait that doubles
// with each failure in a row, up to 10s (nextWait): an API server away for
// minutes gets a few requests and log lines, not one a second.
func (s Schedule) Run(ctx context.Context, interval time.Duration, log logr.Logger,
	round func(ctx context.Context) (soon bool, err error)) error {
	if s.Interval > 0 {
		interval = s.Interval
	}
	changed := make(chan struct{}, 1)
	if s.Classes != nil {
		factory := informers.NewSharedInformerFactory(s.Classes, 0)
		if _, err := factory.Storage().V1().StorageClasses().Informer().AddEventHandler(classHandler(changed)); err != nil {
			return err
		}
		factory.Start(ctx.Done())
		defer factory.Shutdown()
	}
	failures := 0
	for {
		rctx, cancel := context.WithTimeout(ctx, s.RoundTimeout())
		soon, err := round(rctx)
		cancel()
		if err != nil {
			failures++
		} else {
			failures = 0
		}
		wait := nextWait(soon, failures, interval)
		if err != nil {
			log.Error(err, "publish capacities", "failuresInARow", failures, "retryIn", wait)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(wait):
		case <-changed:
		}
	}
}

// maxRetryWait bounds the wait after failed rounds that asked to run soon:
// a failure is mostly the API server's, and the scheduler places no volume
// of a class before its capacity is published.
const maxRetryWait = 10 * time.Second

// nextWait is the wait before the next round: interval; a round that asks
// to run soon, within a second, or, after failures rounds in a row failed,
// 1s, 2s, 4s and so on up to maxRetryWait. A failure never makes the wait
// shorter than the round's own (a pool that cannot be read is not asked
// again sooner than every interval).
func nextWait(soon bool, failures int, interval time.Duration) time.Duration {
	if !soon {
		return interval
	}
	if failures == 0 {
		return min(interval, time.Second)
	}
	return min(interval, maxRetryWait, time.Second<<min(failures-1, 10))
}

// classHandler signals changed, without blocking (one pending round covers
// any number of classes), when a berth StorageClass is added or changed.
func classHandler(changed chan<- struct{}) cache.ResourceEventHandler {
	signal := func() {
		select {
		case changed <- struct{}{}:
		default:
		}
	}
	return cache.FilteringResourceEventHandler{
		FilterFunc: func(obj any) bool {
			cls, ok := obj.(*storagev1.StorageClass)
			return ok && cls.Provisioner == v1.DriverName
		},
		Handler: cache.ResourceEventHandlerFuncs{
			AddFunc:    func(any) { signal() },
			UpdateFunc: func(any, any) { signal() },
		},
	}
}
