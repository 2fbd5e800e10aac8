package fence_test

import (
	"context"
	"math/rand/v2"
	"sync/atomic"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
)

// injector puts random lost races in front of the real API server: a write
// either fails before it reaches the server, or reaches it and still
// reports a conflict (so the caller must find its own write on re-read).
type injector struct {
	rate float64
	n    atomic.Int64
}

var attGR = schema.GroupResource{Group: "berth.io", Resource: "attachments"}

func (in *injector) roll() (inject, after bool) {
	if rand.Float64() >= in.rate {
		return false, false
	}
	in.n.Add(1)
	return true, rand.IntN(2) == 0
}

// do runs write, or makes it lose a race before or after it reached the server.
func (in *injector) do(write func() error, lost error) error {
	inject, after := in.roll()
	if !inject {
		return write()
	}
	if after {
		if err := write(); err != nil {
			return err
		}
	}
	return lost
}

func (in *injector) wrap(c client.WithWatch) client.WithWatch {
	conflict := func(obj client.Object) error { return apierrors.NewConflict(attGR, obj.GetName(), errInjected) }
	return interceptor.NewClient(c, interceptor.Funcs{
		Create: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.CreateOption) error {
			return in.do(func() error { return c.Create(ctx, obj, opts...) }, apierrors.NewAlreadyExists(attGR, obj.GetName()))
		},
		Update: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.UpdateOption) error {
			return in.do(func() error { return c.Update(ctx, obj, opts...) }, conflict(obj))
		},
		Delete: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.DeleteOption) error {
			return in.do(func() error { return c.Delete(ctx, obj, opts...) }, conflict(obj))
		},
	})
}

type injectedError struct{}

func (injectedError) Error() string { return "injected conflict" }

var errInjected error = injectedError{}
