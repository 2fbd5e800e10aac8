package testceph

import (
	"context"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/berth-io/berth/api/v1alpha1"
)

// MakeStorageCluster creates a ceph StorageCluster named name on c's pool,
// and the Secret of c's berth client (same name, in namespace) it names.
func (c *Cluster) MakeStorageCluster(ctx context.Context, cl client.Client, name, namespace, dataDir string) error {
	key, err := c.ClientKey()
	if err != nil {
		return err
	}
	if err := cl.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace},
		StringData: map[string]string{v1.CephSecretUserID: c.Client, v1.CephSecretUserKey: key}}); err != nil {
		return err
	}
	return cl.Create(ctx, &v1.StorageCluster{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: v1.StorageClusterSpec{
		Backend: v1.BackendCeph, DataDir: dataDir,
		Ceph: &v1.CephSpec{Monitors: []v1.CephMonitor{v1.CephMonitor(c.Monitors)}, Pool: c.Pool,
			SecretRef: v1.CephSecretReference{Name: name, Namespace: namespace}},
	}})
}
