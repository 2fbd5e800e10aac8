package sharemanager

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/berth-io/berth/api/v1alpha1"
	"github.com/berth-io/berth/internal/scheme"
	"github.com/berth-io/berth/internal/share"
)

// The share manager reads its ShareManager for the clients to admit: the
// operator keeps them there (spec.clients).
// +kubebuilder:rbac:groups=berth.io,namespace=berth-system,resources=sharemanagers,verbs=get;list;watch

// admitted is the client list of the share, handed to the server that
// runs now (ganesha rereads it) and to each one started later.
type admitted struct {
	mu    sync.Mutex
	known bool
	list  []string
	srv   *share.Server
}

// set makes list the clients; a server running now gets them at once.
func (a *admitted) set(list []string) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.known, a.list = true, slices.Clone(list)
	if a.srv == nil {
		return nil
	}
	return a.srv.SetClients(list)
}

// serve gives srv the clients and every later change, until the returned
// func is called.
func (a *admitted) serve(srv *share.Server) (func(), error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if err := srv.SetClients(a.list); err != nil {
		return nil, err
	}
	a.srv = srv
	return func() {
		a.mu.Lock()
		defer a.mu.Unlock()
		a.srv = nil
	}, nil
}

// addresses are the clients' addresses of sm.
func addresses(sm *v1.ShareManager) []string {
	var out []string
	for _, c := range sm.Spec.Clients {
		out = append(out, c.Addresses...)
	}
	return out
}

// shares is the client of ShareManagers (the seam, else one from the
// kube flags).
func (c Config) shares() (client.WithWatch, error) {
	if c.Shares != nil {
		return c.Shares, nil
	}
	rc, err := c.Kube.RestConfig()
	if err != nil {
		return nil, err
	}
	sch, err := scheme.New()
	if err != nil {
		return nil, err
	}
	return client.NewWithWatch(rc, client.Options{Scheme: sch})
}

// clientsRetry is the pause before the ShareManager is read or watched
// again after a failure.
const clientsRetry = time.Second

// loadClients reads the ShareManager's clients once, retrying until
// timeout: ganesha must start with them, or clients that reclaim their
// state in its grace period after a failover would be refused.
func (c Config) loadClients(ctx context.Context, cl client.Client, a *admitted, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for {
		sm := &v1.ShareManager{}
		err := cl.Get(ctx, client.ObjectKey{Namespace: c.Lease.Namespace, Name: c.ShareManager}, sm)
		if err == nil {
			return a.set(addresses(sm))
		}
		c.Log.Info("cannot read the ShareManager yet", "name", c.ShareManager, "err", err.Error())
		select {
		case <-ctx.Done():
			return fmt.Errorf("read ShareManager %s/%s for the share's clients: %w", c.Lease.Namespace, c.ShareManager, err)
		case <-time.After(clientsRetry):
		}
	}
}

// followClients keeps a to the ShareManager's clients until ctx ends, by
// a watch started again whenever it ends.
func (c Config) followClients(ctx context.Context, cl client.WithWatch, a *admitted) {
	for ctx.Err() == nil {
		if err := c.watchClients(ctx, cl, a); err != nil && ctx.Err() == nil {
			c.Log.Info("watch of the share's clients ended; watching again", "err", err.Error())
		}
		select {
		case <-ctx.Done():
		case <-time.After(clientsRetry):
		}
	}
}

func (c Config) watchClients(ctx context.Context, cl client.WithWatch, a *admitted) error {
	w, err := cl.Watch(ctx, &v1.ShareManagerList{}, client.InNamespace(c.Lease.Namespace),
		client.MatchingFields{"metadata.name": c.ShareManager})
	if err != nil {
		return err
	}
	defer w.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case ev, ok := <-w.ResultChan():
			if !ok {
				return nil
			}
			sm, isSM := ev.Object.(*v1.ShareManager)
			if !isSM || ev.Type == watch.Deleted {
				continue
			}
			if err := a.set(addresses(sm)); err != nil {
				// A list ganesha cannot take: keep serving the last one.
				c.Log.Error(err, "share clients not changed", "clients", addresses(sm))
			}
		}
	}
}
