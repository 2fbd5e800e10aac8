package testceph

import (
	"context"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/berth-io/berth/api/v1alpha1"
)

// MakeStorageCluster creates a ceph StorageCluster named name on c's pool,
// and the Secrets it names (in namespace): name with c's berth client,
// name-node with the nodes' client.
func (c *Cluster) MakeStorageCluster(ctx context.Context, cl client.Client, name, namespace, dataDir string) error {
	for _, s := range []struct{ secret, client, keyring string }{{name, c.Client, c.Keyring}, {name + "-node", c.NodeClient, c.NodeKeyring}} {
		key, err := keyringKey(s.keyring)
		if err != nil {
			return err
		}
		if err := cl.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: s.secret, Namespace: namespace},
			StringData: map[string]string{v1.CephSecretUserID: s.client, v1.CephSecretUserKey: key}}); err != nil {
			return err
		}
	}
	return cl.Create(ctx, &v1.StorageCluster{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: v1.StorageClusterSpec{
		Backend: v1.BackendCeph, DataDir: dataDir,
		Ceph: &v1.CephSpec{Monitors: []v1.CephMonitor{v1.CephMonitor(c.Monitors)}, Pool: c.Pool,
			SecretRef:     v1.CephSecretReference{Name: name, Namespace: namespace},
			NodeSecretRef: &v1.CephSecretReference{Name: name + "-node", Namespace: namespace}},
	}})
}
