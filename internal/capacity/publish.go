// Package capacity publishes CSIStorageCapacity objects: the agents' per-node
// capacities and the CSI controller's per-pool ones share how one is written.
package capacity

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"

	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Publish writes free bytes of cls as the CSIStorageCapacity name in
// namespace, creating it with labels and topology, or updating only its
// capacity (the rest of an object never changes for one name).
func Publish(ctx context.Context, c client.Client, namespace, name string, labels map[string]string,
	topology *metav1.LabelSelector, cls *storagev1.StorageClass, free int64) error {
	want := resource.NewQuantity(free, resource.BinarySI)
	var cur storagev1.CSIStorageCapacity
	err := c.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, &cur)
	switch {
	case apierrors.IsNotFound(err):
		cur = storagev1.CSIStorageCapacity{
			ObjectMeta: metav1.ObjectMeta{
				Name: name, Namespace: namespace, Labels: labels,
				// Gone with its class: a class deleted leaves no capacity behind.
				OwnerReferences: []metav1.OwnerReference{{
					APIVersion: "storage.k8s.io/v1", Kind: "StorageClass", Name: cls.Name, UID: cls.UID,
				}},
			},
			NodeTopology:     topology,
			StorageClassName: cls.Name,
			Capacity:         want,
		}
		if err := c.Create(ctx, &cur); err != nil {
			return fmt.Errorf("create csistoragecapacity %s: %w", name, err)
		}
		return nil
	case err != nil:
		return fmt.Errorf("get csistoragecapacity %s: %w", name, err)
	}
	if cur.Capacity != nil && cur.Capacity.Cmp(*want) == 0 {
		return nil
	}
	cur.Capacity = want
	if err := c.Update(ctx, &cur); err != nil {
		return fmt.Errorf("update csistoragecapacity %s: %w", name, err)
	}
	return nil
}

// Name is the CSIStorageCapacity name for key under prefix: a hash, since
// class (and node) names together can exceed an object name's length.
func Name(prefix, key string) string {
	sum := sha256.Sum256([]byte(key))
	return prefix + hex.EncodeToString(sum[:])[:32]
}
