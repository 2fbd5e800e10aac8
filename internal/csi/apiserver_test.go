package csi

import (
	"context"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/berth-io/berth/internal/testenv"
)

// apiCtx needs the test API server and returns a context that ends with
// the test, or after d.
func apiCtx(t *testing.T, d time.Duration) context.Context {
	t.Helper()
	suite.Require(t)
	return testenv.Context(t, d)
}

// create makes obj on the test API server and deletes it when the test
// ends.
func create(ctx context.Context, t *testing.T, obj client.Object) {
	t.Helper()
	if err := env.Client.Create(ctx, obj); err != nil {
		t.Fatalf("create %T %s: %v", obj, obj.GetName(), err)
	}
	t.Cleanup(func() { _ = env.Client.Delete(context.Background(), obj) })
}

// apiController is a CSI controller on the test API server, logging to t.
func apiController(t *testing.T, cfg ControllerConfig) *Controller {
	return NewController(env.Client, cfg, testr.New(t))
}
