package testenv

import (
	"context"
	"fmt"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Context is a context for a test's calls that ends after d, or at the
// test's end: cancelled as a cleanup, so cleanups registered after it can
// still use it (t.Context ends before any cleanup runs).
func Context(tb testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	tb.Cleanup(cancel)
	return ctx
}

// Eventually polls cond until it holds or timeout passes; errors are
// retried (a cache may lag) and the last one is reported.
func Eventually(t testing.TB, timeout time.Duration, what string, cond func(ctx context.Context) (bool, error)) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout+10*time.Second)
	defer cancel()
	var last error
	err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		ok, err := cond(ctx)
		last = err
		return ok && err == nil, nil
	})
	if err != nil {
		t.Fatalf("%s: %v (last error: %v)", what, err, last)
	}
}

// WaitFor polls cond until it holds, failing t after timeout.
func WaitFor(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	Eventually(t, timeout, "waiting for "+what, func(context.Context) (bool, error) { return cond(), nil })
}

// WaitGet waits up to timeout until obj exists and reads it.
func (e *Env) WaitGet(t testing.TB, timeout time.Duration, obj client.Object) {
	t.Helper()
	Eventually(t, timeout, fmt.Sprintf("%T %s exists", obj, obj.GetName()), func(ctx context.Context) (bool, error) {
		err := e.Client.Get(ctx, client.ObjectKeyFromObject(obj), obj)
		return err == nil, client.IgnoreNotFound(err)
	})
}
