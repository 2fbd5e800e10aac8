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
// runs now (ganesha rereads it) and to each one started later. report,
// when set, is told the nodes admitted after each change that took.
type admitted struct {
	mu sync.Mutex
	// extra are admitted always (--clients).
	extra  []string
	list   []v1.ShareClient
	srv    *share.Server
	report func(nodes []string)
}

// set makes clients the share's; a server running now gets them at once.
func (a *admitted) set(clients []v1.ShareClient) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.srv != nil {
		if err := a.srv.SetClients(append(addresses(clients), a.extra...)); err != nil {
			return err
		}
	}
	a.list = slices.Clone(clients)
	a.tell()
	return nil
}

// serve gives srv the clients and every later change, until the returned
// func is called.
func (a *admitted) serve(srv *share.Server) (func(), error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if err := srv.SetClients(append(addresses(a.list), a.extra...)); err != nil {
		return nil, err
	}
	a.srv = srv
	return func() {
		a.mu.Lock()
		defer a.mu.Unlock()
		a.srv = nil
	}, nil
}

// tell reports the nodes of the list; called with mu held.
func (a *admitted) tell() {
	if a.report == nil {
		return
	}
	nodes := make([]string, 0, len(a.list))
	for _, c := range a.list {
		nodes = append(nodes, c.Node)
	}
	slices.Sort(nodes)
	a.report(slices.Compact(nodes))
}

// addresses are the addresses of clients.
func addresses(clients []v1.ShareClient) []string {
	var out []string
	for _, c := range clients {
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
			return a.set(sm.Spec.Clients)
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
	// Read after the watch started: a change made before it, since the
	// last read, is not lost.
	sm := &v1.ShareManager{}
	if err := cl.Get(ctx, client.ObjectKey{Namespace: c.Lease.Namespace, Name: c.ShareManager}, sm); err != nil {
		return err
	}
	if err := a.set(sm.Spec.Clients); err != nil {
		c.Log.Error(err, "share clients not changed", "clients", addresses(sm.Spec.Clients))
	}
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
			if err := a.set(sm.Spec.Clients); err != nil {
				// A list ganesha cannot take: keep serving the last one.
				c.Log.Error(err, "share clients not changed", "clients", addresses(sm.Spec.Clients))
			}
		}
	}
}
