package ceph

import (
	"context"
	"errors"
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/berth-io/berth/api/v1alpha1"
)

// The ways a StorageCluster's Secret is unusable, for callers to map: the
// operator to its condition, the CSI controller to FailedPrecondition.
var (
	ErrSecretNotFound   = errors.New("not found")
	ErrSecretIncomplete = errors.New("lacks key")
)

// Secret is the cephx client a StorageCluster's Secret names.
type Secret struct {
	UserID, UserKey string
	// Version is the Secret's resourceVersion: a connection opened with
	// an older one is stale.
	Version string
}

// ReadSecret reads the Secret ref names, which must be in berth's
// namespace (CheckSecretRef), with both of its keys. Read it uncached:
// whoever caches Secrets caches every Secret of the namespace.
func ReadSecret(ctx context.Context, c client.Reader, ref v1.CephSecretReference, namespace string) (Secret, error) {
	if err := CheckSecretRef(ref, namespace); err != nil {
		return Secret{}, err
	}
	var s corev1.Secret
	if err := c.Get(ctx, client.ObjectKey{Namespace: ref.Namespace, Name: ref.Name}, &s); apierrors.IsNotFound(err) {
		return Secret{}, fmt.Errorf("Secret %s/%s %w", ref.Namespace, ref.Name, ErrSecretNotFound)
	} else if err != nil {
		return Secret{}, fmt.Errorf("read Secret %s/%s: %w", ref.Namespace, ref.Name, err)
	}
	var missing []string
	for _, k := range []string{v1.CephSecretUserID, v1.CephSecretUserKey} {
		if len(s.Data[k]) == 0 {
			missing = append(missing, k)
		}
	}
	if len(missing) > 0 {
		return Secret{}, fmt.Errorf("Secret %s/%s %w %s", ref.Namespace, ref.Name, ErrSecretIncomplete, strings.Join(missing, " and "))
	}
	return Secret{UserID: string(s.Data[v1.CephSecretUserID]), UserKey: string(s.Data[v1.CephSecretUserKey]), Version: s.ResourceVersion}, nil
}
