package storagecluster

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	v1 "github.com/berth-io/berth/api/v1alpha1"
	"github.com/berth-io/berth/internal/backend/ceph"
)

// ConditionBackendReady says whether the cluster's backend can hold
// volumes: always for local, after a connection check for ceph.
const ConditionBackendReady = "BackendReady"

// BackendReady reasons (condition and Event).
const (
	ReasonLocalBackend         = "Local"
	ReasonConnected            = "Connected"
	ReasonMonitorsUnreachable  = "MonitorsUnreachable"
	ReasonAuthenticationFailed = "AuthenticationFailed"
	ReasonPoolNotFound         = "PoolNotFound"
	ReasonSecretInvalid        = "SecretInvalid"
	ReasonCephNotBuilt         = "CephNotBuilt"
	ReasonCephError            = "CephError"
)

// How long a ceph check's answer stands: a failure is retried soon, a
// success rechecked now and then (Ceph may go away, the key be revoked).
const (
	cephRecheckFailed = 30 * time.Second
	cephRecheckOK     = 10 * time.Minute
	// DefaultCephConnectTimeout bounds connecting and each Ceph request of
	// a check; the whole check gets twice that.
	DefaultCephConnectTimeout = 10 * time.Second
)

// CephCheck connects to Ceph as cfg says and reports what is wrong
// (ceph.Check; a stub without the ceph build tag).
type CephCheck func(ctx context.Context, cfg ceph.Config, log logr.Logger) error

// cephChecks keeps each cluster's last check, so that the many reconciles
// a cluster gets (every DaemonSet status change) do not each dial Ceph.
type cephChecks struct {
	mu   sync.Mutex
	last map[types.UID]cephCheckResult
}

type cephCheckResult struct {
	// input: the spec generation and the Secret's resourceVersion checked.
	input string
	cond  metav1.Condition
	at    time.Time
}

func (c *cephChecks) get(uid types.UID, input string, now time.Time) (metav1.Condition, time.Duration, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	r, ok := c.last[uid]
	if !ok || r.input != input {
		return metav1.Condition{}, 0, false
	}
	ttl := cephRecheckOK
	if r.cond.Status != metav1.ConditionTrue {
		ttl = cephRecheckFailed
	}
	left := ttl - now.Sub(r.at)
	return r.cond, left, left > 0
}

func (c *cephChecks) put(uid types.UID, r cephCheckResult) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.last == nil {
		c.last = map[types.UID]cephCheckResult{}
	}
	c.last[uid] = r
}

func (c *cephChecks) forget(uid types.UID) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.last, uid)
}

// +kubebuilder:rbac:groups="",namespace=berth-system,resources=secrets,verbs=get

// backendCondition says whether sc's backend can hold volumes and when to
// look again (0: only on change). A changed answer is also an Event. The
// Secret's key never reaches a log, a condition or an Event.
func (r *Reconciler) backendCondition(ctx context.Context, log logr.Logger, sc *v1.StorageCluster) (metav1.Condition, time.Duration) {
	if sc.Spec.Backend != v1.BackendCeph || sc.Spec.Ceph == nil {
		return metav1.Condition{Type: ConditionBackendReady, Status: metav1.ConditionTrue, Reason: ReasonLocalBackend,
			Message: "volumes are image files on their node's disk under " + sc.Spec.DataDir}, 0
	}
	cond, recheck := r.checkCeph(ctx, log, sc)
	cond.Type = ConditionBackendReady
	if cond.Reason == ReasonMonitorsUnreachable {
		cond.Message += publicNetworkHint(sc)
	}
	// Without a node key every node holds the operator's, which may take
	// a fenced client off the blocklist (F5): usable, but said, and a
	// Warning Event.
	sharedKey := cond.Status == metav1.ConditionTrue && sc.Spec.Ceph.NodeSecretRef == nil
	if sharedKey {
		cond.Message += SharedNodeKeyHint
	}
	r.conditionEvent(sc, cond, cond.Status != metav1.ConditionTrue || sharedKey)
	return cond, recheck
}

// SharedNodeKeyHint ends the BackendReady message of a ceph cluster with
// no spec.ceph.nodeSecretRef.
const SharedNodeKeyHint = "; the nodes stage with secretRef's client too, whose key can take a fenced node's client off " +
	"Ceph's blocklist: give them a client of their own, with profile rbd alone (spec.ceph.nodeSecretRef, docs/ceph.md#keys-by-role)"

func (r *Reconciler) checkCeph(ctx context.Context, log logr.Logger, sc *v1.StorageCluster) (metav1.Condition, time.Duration) {
	spec := sc.Spec.Ceph
	ref := spec.SecretRef
	failed := func(reason, format string, args ...any) (metav1.Condition, time.Duration) {
		return metav1.Condition{Status: metav1.ConditionFalse, Reason: reason, Message: fmt.Sprintf(format, args...)}, cephRecheckFailed
	}
	direct := r.Direct
	if direct == nil {
		direct = r.Client
	}
	// A fixed Secret is seen at the next recheck: the operator watches no
	// Secret.
	secret, err := ceph.ReadSecret(ctx, direct, ref, r.Options.Namespace)
	if err != nil {
		return failed(ReasonSecretInvalid, "%v", err)
	}
	input := fmt.Sprintf("%d/%s", sc.Generation, secret.Version)
	// The nodes' Secret is kubelet's to hand over; a missing one would
	// fail every stage, so it is checked here, by name and keys only.
	if spec.NodeSecretRef != nil {
		node, err := ceph.ReadSecret(ctx, direct, *spec.NodeSecretRef, r.Options.Namespace)
		if err != nil {
			return failed(ReasonSecretInvalid, "nodeSecretRef: %v", err)
		}
		input += "/" + node.Version
	}
	now := r.clock().Now()
	if cond, left, ok := r.cephChecks.get(sc.UID, input, now); ok {
		return cond, left
	}

	timeout := r.CephConnectTimeout
	if timeout <= 0 {
		timeout = DefaultCephConnectTimeout
	}
	ctx, cancel := context.WithTimeout(ctx, 2*timeout)
	defer cancel()
	cond, recheck := r.dialCeph(ctx, log, spec, secret, timeout)
	r.cephChecks.put(sc.UID, cephCheckResult{input: input, cond: cond, at: now})
	return cond, recheck
}

// publicNetworkHint names, for a cluster whose Ceph clients use a Multus
// public network, the likely cause of unreachable monitors: the check runs
// from the operator's own pod, which the StorageCluster does not place on
// that network (the agents' holders and the CSI controller it does).
func publicNetworkHint(sc *v1.StorageCluster) string {
	sel := sc.Spec.Network.Selectors
	if sc.Spec.Network.Provider != v1.NetworkProviderMultus || sel == nil || sel.Public == "" {
		return ""
	}
	return fmt.Sprintf("; this cluster's Ceph public network is the Multus network %s: "+
		"the operator checks from its own pod, which reaches the monitors only when it is on that network too "+
		"(Helm value operator.networks=%s)", sel.Public, sel.Public)
}

// dialCeph runs the connection check; ctx bounds it.
func (r *Reconciler) dialCeph(ctx context.Context, log logr.Logger, spec *v1.CephSpec, secret ceph.Secret, timeout time.Duration) (metav1.Condition, time.Duration) {
	cfg, err := ceph.ConfigFor(ctx, spec, secret.UserID, secret.UserKey, r.LookupHost)
	if err == nil {
		cfg.ConnectTimeout, cfg.OpTimeout = timeout, timeout
		check := r.CheckCeph
		if check == nil {
			check = ceph.Check
		}
		start := r.clock().Now()
		err = check(ctx, cfg, log)
		log.V(1).Info("ceph connection check", "config", cfg.String(), "took", r.clock().Since(start).String(), "error", err)
	}
	cond := metav1.Condition{Status: metav1.ConditionFalse, Reason: ReasonCephError}
	switch {
	case err == nil:
		cond.Status, cond.Reason = metav1.ConditionTrue, ReasonConnected
		cond.Message = fmt.Sprintf("connected to %s as client.%s; pool %s is usable", cfg.Monitors, cfg.Client, spec.Pool)
		return cond, cephRecheckOK
	case errors.Is(err, ceph.ErrNotBuilt):
		cond.Reason = ReasonCephNotBuilt
	case errors.Is(err, ceph.ErrAuthentication):
		cond.Reason = ReasonAuthenticationFailed
	case errors.Is(err, ceph.ErrPoolNotFound):
		cond.Reason = ReasonPoolNotFound
	case errors.Is(err, ceph.ErrMonitorsUnreachable), errors.Is(err, context.DeadlineExceeded):
		cond.Reason = ReasonMonitorsUnreachable
	}
	cond.Message = err.Error()
	if cfg.Key != "" {
		// Ceph's own messages never quote the key; make sure.
		cond.Message = strings.ReplaceAll(cond.Message, cfg.Key, "<key>")
	}
	return cond, cephRecheckFailed
}
