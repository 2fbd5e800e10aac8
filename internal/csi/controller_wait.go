package csi

// The controller records what it wants in the API server and waits for the
// node's agent to make it: these helpers read the object once and then
// watch it from that read's resourceVersion, so the wait ends as soon as the
// agent writes and costs the API server one list and one watch, bounded by
// the call's deadline and ControllerConfig.Wait.

import (
	"context"
	"errors"
	"fmt"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/apiutil"

	v1 "github.com/berth-io/berth/api/v1alpha1"
)

// rewatchEvery bounds how often a wait lists and watches again after its
// watch ended (the API server's watch timeout, an expired version).
const rewatchEvery = time.Second

// waitVolume waits until done says so of the Volume.
func (s *Controller) waitVolume(ctx context.Context, name string, done func(*v1.Volume) bool) (*v1.Volume, error) {
	return waitFor(ctx, s, &v1.Volume{ObjectMeta: metav1.ObjectMeta{Name: name}}, "volume", "volumes", done)
}

// waitSnapshot waits until done says so of the Snapshot.
func (s *Controller) waitSnapshot(ctx context.Context, name string, done func(*v1.Snapshot) bool) (*v1.Snapshot, error) {
	return waitFor(ctx, s, &v1.Snapshot{ObjectMeta: metav1.ObjectMeta{Name: name}}, "snapshot", "snapshots", done)
}

// waitFor waits until done says so of obj, a berth object of the given kind
// and resource; one that is deleted meanwhile ends the wait as NotFound.
func waitFor[T client.Object](ctx context.Context, s *Controller, obj T, kind, resource string, done func(T) bool) (T, error) {
	var none T
	name := obj.GetName()
	o, err := s.waitObject(ctx, obj, func(o client.Object) bool {
		v, ok := o.(T)
		return !ok || done(v) // gone: nothing more to wait for
	})
	if err != nil {
		return none, waitError(kind+" "+name, err)
	}
	v, ok := o.(T)
	if !ok {
		return none, waitError(kind+" "+name, apierrors.NewNotFound(v1.GroupVersion.WithResource(resource).GroupResource(), name))
	}
	return v, nil
}

// waitGone waits until obj no longer exists.
func (s *Controller) waitGone(ctx context.Context, obj client.Object) error {
	if _, err := s.waitObject(ctx, obj, func(o client.Object) bool { return o == nil }); err != nil {
		return waitError(obj.GetName()+" removal", err)
	}
	return nil
}

// waitObject returns the first state of the object named like obj that
// done accepts: the object, or nil once it does not exist.
func (s *Controller) waitObject(ctx context.Context, obj client.Object, done func(client.Object) bool) (client.Object, error) {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.Wait)
	defer cancel()
	wc, ok := s.c.(client.WithWatch)
	if !ok {
		return s.pollObject(ctx, obj, done)
	}
	list, err := s.listOf(obj)
	if err != nil {
		return nil, err
	}
	byName := client.MatchingFields{"metadata.name": obj.GetName()}
	for {
		started := time.Now()
		if err := wc.List(ctx, list, byName); err != nil {
			return nil, err
		}
		items, err := meta.ExtractList(list)
		if err != nil {
			return nil, err
		}
		var cur client.Object
		if len(items) > 0 {
			cur, _ = items[0].(client.Object)
		}
		if done(cur) {
			return cur, nil
		}
		w, err := wc.Watch(ctx, list, byName, &client.ListOptions{Raw: &metav1.ListOptions{ResourceVersion: list.GetResourceVersion()}})
		if err != nil {
			return nil, err
		}
		cur, finished := follow(ctx, w, done)
		w.Stop()
		if finished {
			return cur, nil
		}
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(rewatchEvery - time.Since(started)):
		}
	}
}

// follow reads w until done accepts a state; finished is false when the
// watch ended first (or ctx did).
func follow(ctx context.Context, w watch.Interface, done func(client.Object) bool) (client.Object, bool) {
	for {
		select {
		case <-ctx.Done():
			return nil, false
		case ev, ok := <-w.ResultChan():
			if !ok {
				return nil, false
			}
			switch ev.Type {
			case watch.Added, watch.Modified:
				if o, ok := ev.Object.(client.Object); ok && done(o) {
					return o, true
				}
			case watch.Deleted:
				if done(nil) {
					return nil, true
				}
			case watch.Error:
				return nil, false // expired version: list again
			}
		}
	}
}

// listOf returns an empty list of obj's kind.
func (s *Controller) listOf(obj client.Object) (client.ObjectList, error) {
	gvk, err := apiutil.GVKForObject(obj, s.c.Scheme())
	if err != nil {
		return nil, err
	}
	gvk.Kind += "List"
	o, err := s.c.Scheme().New(gvk)
	if err != nil {
		return nil, fmt.Errorf("list kind of %s: %w", gvk.Kind, err)
	}
	list, ok := o.(client.ObjectList)
	if !ok {
		return nil, fmt.Errorf("%s is not a list", gvk.Kind)
	}
	return list, nil
}

// pollObject is waitObject for a client that cannot watch (unit tests'
// fakes): it reads the object every Poll.
func (s *Controller) pollObject(ctx context.Context, obj client.Object, done func(client.Object) bool) (client.Object, error) {
	var cur client.Object
	err := wait.PollUntilContextCancel(ctx, s.cfg.Poll, true, func(ctx context.Context) (bool, error) {
		err := s.c.Get(ctx, client.ObjectKeyFromObject(obj), obj)
		switch {
		case apierrors.IsNotFound(err):
			cur = nil
		case err != nil:
			return false, err
		default:
			cur = obj
		}
		return done(cur), nil
	})
	return cur, err
}

func waitError(what string, err error) error {
	if wait.Interrupted(err) || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
		return status.Errorf(codes.DeadlineExceeded, "waiting for the agent: %s not done yet; the call may be retried", what)
	}
	return status.Errorf(codes.Unavailable, "waiting for %s: %v", what, err)
}
