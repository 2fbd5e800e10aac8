package csi

// The controller records what it wants in the API server and waits for the
// node's agent to make it: these helpers poll, bounded by the call's deadline
// and ControllerConfig.Wait.

import (
	"context"
	"errors"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/berth-io/berth/api/v1alpha1"
)

// waitVolume polls the Volume until done says so.
func (s *Controller) waitVolume(ctx context.Context, name string, done func(*v1.Volume) bool) (*v1.Volume, error) {
	vol := &v1.Volume{}
	err := s.poll(ctx, func(ctx context.Context) (bool, error) {
		if err := s.c.Get(ctx, client.ObjectKey{Name: name}, vol); err != nil {
			return false, err
		}
		return done(vol), nil
	})
	if err != nil {
		return nil, waitError("volume "+name, err)
	}
	return vol, nil
}

func (s *Controller) waitGone(ctx context.Context, obj client.Object) error {
	err := s.poll(ctx, func(ctx context.Context) (bool, error) {
		err := s.c.Get(ctx, client.ObjectKeyFromObject(obj), obj)
		if apierrors.IsNotFound(err) {
			return true, nil
		}
		return false, err
	})
	if err != nil {
		return waitError(obj.GetName()+" removal", err)
	}
	return nil
}

func (s *Controller) poll(ctx context.Context, cond wait.ConditionWithContextFunc) error {
	return wait.PollUntilContextTimeout(ctx, s.cfg.Poll, s.cfg.Wait, true, cond)
}

func waitError(what string, err error) error {
	if wait.Interrupted(err) || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
		return status.Errorf(codes.DeadlineExceeded, "waiting for the agent: %s not done yet; the call may be retried", what)
	}
	return status.Errorf(codes.Unavailable, "waiting for %s: %v", what, err)
}
