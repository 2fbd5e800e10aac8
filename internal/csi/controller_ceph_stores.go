package csi

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"

	"github.com/go-logr/logr"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/berth-io/berth/api/v1alpha1"
	"github.com/berth-io/berth/internal/backend"
	"github.com/berth-io/berth/internal/backend/ceph"
)

// OpenCeph connects to a Ceph cluster (ceph.Open; without the ceph build
// tag it refuses with ceph.ErrNotBuilt).
type OpenCeph func(ctx context.Context, cfg ceph.Config, log logr.Logger) (ceph.Store, error)

// cephStores keeps one connection per ceph StorageCluster, opened on first
// use and replaced when the cluster's spec or its Secret changes.
type cephStores struct {
	open   OpenCeph
	lookup func(ctx context.Context, host string) ([]string, error)
	// namespace is berth's: the only one whose Secrets it reads.
	namespace string
	log       logr.Logger

	mu    sync.Mutex
	conns map[string]*cephConn
}

type cephConn struct {
	// input: the spec generation and Secret resourceVersion it was opened with.
	input string
	store ceph.Store
	// refs counts calls using store; a replaced connection is closed when
	// its last call is done, not under it.
	refs    int
	retired bool
}

// get returns sc's connection and the release to call when done with it.
// Opening holds the lock: a cluster is dialled once, not by every call
// that finds it missing.
func (p *cephStores) get(ctx context.Context, c client.Client, sc *v1.StorageCluster) (ceph.Store, func(), error) {
	if sc.Spec.Ceph == nil {
		return nil, nil, status.Errorf(codes.FailedPrecondition, "StorageCluster %s has backend ceph but no spec.ceph", sc.Name)
	}
	secret, err := ceph.ReadSecret(ctx, c, sc.Spec.Ceph.SecretRef, p.namespace)
	switch {
	case errors.Is(err, ceph.ErrSecretNamespace) || errors.Is(err, ceph.ErrSecretNotFound) || errors.Is(err, ceph.ErrSecretIncomplete):
		return nil, nil, status.Errorf(codes.FailedPrecondition, "StorageCluster %s: %v", sc.Name, err)
	case err != nil:
		return nil, nil, status.Errorf(codes.Unavailable, "StorageCluster %s: %v", sc.Name, err)
	}
	id, key := secret.UserID, secret.UserKey
	input := fmt.Sprintf("%d/%s", sc.Generation, secret.Version)

	p.mu.Lock()
	defer p.mu.Unlock()
	if cur := p.conns[sc.Name]; cur != nil && cur.input == input {
		cur.refs++
		return cur.store, p.release(cur), nil
	}
	cfg, err := ceph.ConfigFor(ctx, sc.Spec.Ceph, id, key, p.lookup)
	if err != nil {
		return nil, nil, cephStatus(fmt.Sprintf("StorageCluster %s", sc.Name), err, key)
	}
	open := p.open
	if open == nil {
		open = ceph.Open
	}
	store, err := open(ctx, cfg, p.log.WithValues("storageCluster", sc.Name))
	if err != nil {
		return nil, nil, cephStatus(fmt.Sprintf("StorageCluster %s", sc.Name), err, key)
	}
	if old := p.conns[sc.Name]; old != nil {
		old.retired = true
		if old.refs == 0 {
			old.store.Close()
		}
	}
	if p.conns == nil {
		p.conns = map[string]*cephConn{}
	}
	cur := &cephConn{input: input, store: store, refs: 1}
	p.conns[sc.Name] = cur
	return store, p.release(cur), nil
}

func (p *cephStores) release(cc *cephConn) func() {
	var once sync.Once
	return func() {
		once.Do(func() {
			p.mu.Lock()
			defer p.mu.Unlock()
			cc.refs--
			if cc.retired && cc.refs == 0 {
				cc.store.Close()
			}
		})
	}
}

// close closes every connection; calls must be done (at shutdown).
func (p *cephStores) close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for name, cc := range p.conns {
		cc.store.Close()
		delete(p.conns, name)
	}
}

// cephStatus turns a ceph backend error into the CSI code its kind calls
// for; key, when set, never reaches the message.
func cephStatus(what string, err error, key string) error {
	code := codes.Internal
	var rc interface{ ErrorCode() int }
	switch {
	case errors.Is(err, ceph.ErrNotBuilt), errors.Is(err, ceph.ErrAuthentication),
		errors.Is(err, ceph.ErrPoolNotFound), cephHasSnapshots(err):
		code = codes.FailedPrecondition
	case errors.Is(err, ceph.ErrMonitorsUnreachable), errors.Is(err, context.DeadlineExceeded),
		errors.Is(err, context.Canceled):
		code = codes.Unavailable
	case errors.As(err, &rc) && (rc.ErrorCode() == -110 || rc.ErrorCode() == 110):
		code = codes.Unavailable // ETIMEDOUT: an OSD or monitor did not answer
	case errors.Is(err, backend.ErrNotFound):
		code = codes.NotFound
	case errors.Is(err, backend.ErrExists):
		code = codes.AlreadyExists
	case errors.Is(err, backend.ErrNoSpace):
		code = codes.ResourceExhausted
	}
	msg := fmt.Sprintf("%s: %v", what, err)
	if key != "" {
		msg = strings.ReplaceAll(msg, key, "<key>")
	}
	return status.Error(code, msg)
}
