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

func (in *injector) wrap(c client.WithWatch) client.WithWatch {
	conflict := func(obj client.Object) error {
		return apierrors.NewConflict(attGR, obj.GetName(), errInjected)
	}
	return interceptor.NewClient(c, interceptor.Funcs{
		Create: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.CreateOption) error {
			inject, after := in.roll()
			if !inject {
				return c.Create(ctx, obj, opts...)
			}
			if after {
				if err := c.Create(ctx, obj, opts...); err != nil {
					return err
				}
			}
			return apierrors.NewAlreadyExists(attGR, obj.GetName())
		},
		Update: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.UpdateOption) error {
			inject, after := in.roll()
			if !inject {
				return c.Update(ctx, obj, opts...)
			}
			if after {
				if err := c.Update(ctx, obj, opts...); err != nil {
					return err
				}
			}
			return conflict(obj)
		},
		Delete: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.DeleteOption) error {
			inject, after := in.roll()
			if !inject {
				return c.Delete(ctx, obj, opts...)
			}
			if after {
				if err := c.Delete(ctx, obj, opts...); err != nil {
					return err
				}
			}
			return conflict(obj)
		},
	})
}

type injectedError struct{}

func (injectedError) Error() string { return "injected conflict" }

var errInjected error = injectedError{}
