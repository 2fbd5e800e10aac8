package dev

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	v1 "github.com/berth-io/berth/api/v1alpha1"
)

// Backends `berth dev up --backend` takes.
const (
	BackendLocal = string(v1.BackendLocal)
	BackendCeph  = string(v1.BackendCeph)
)

// CephSecret is the Secret (in Namespace) with the test Ceph's client
// that the ceph StorageClusters of `up` name (secretRef: the operator's and
// the CSI controller's); CephNodeSecret the one with the nodes' client
// (nodeSecretRef: `profile rbd` alone).
const (
	CephSecret     = "berth-ceph"
	CephNodeSecret = "berth-ceph-node"
)

// CephStorageCluster is the ceph StorageCluster `up --test-ceph` adds
// beside a local berth (its userspace class: berth-ceph-userspace).
const CephStorageCluster = "berth-ceph"

// ErrBackend means a --backend other than local or ceph.
var ErrBackend = errors.New("--backend must be local or ceph")

// ErrNoCephKey means the test Ceph's client keyring holds no key.
var ErrNoCephKey = errors.New("no key in the ceph client keyring")

// needsCeph tells whether up starts the test Ceph in the cluster's network.
func (c Config) needsCeph() bool { return c.Backend == BackendCeph || c.TestCeph }

// cephClusters are the StorageClusters up makes on the test Ceph.
func (c Config) cephClusters() []string {
	switch {
	case c.Backend == BackendCeph:
		return []string{StorageCluster}
	case c.TestCeph:
		return []string{CephStorageCluster}
	}
	return nil
}

// storageClusters are the StorageClusters up makes and waits for.
func (c Config) storageClusters() []string {
	if c.Backend == BackendCeph {
		return []string{StorageCluster}
	}
	return append([]string{StorageCluster}, c.cephClusters()...)
}

// cephUp starts the test Ceph inside the cluster's network
// (hack/cluster/ceph.sh up) and reads its ceph.env.
func (c Config) cephUp(ctx context.Context) (ClusterEnv, error) {
	if err := c.runScriptArgs(ctx, "ceph.sh", []string{"up"}); err != nil {
		return nil, err
	}
	return LoadCephEnv(filepath.Join(c.WorkDir, "ceph", "ceph.env"))
}

// LoadCephEnv reads the ceph.env hack/ceph/up.sh writes and checks the keys
// a StorageCluster needs.
func LoadCephEnv(path string) (ClusterEnv, error) {
	env, err := ReadClusterEnv(path)
	if err != nil {
		return nil, err
	}
	for _, k := range []string{"BERTH_CEPH_MONITORS", "BERTH_CEPH_POOL", "BERTH_CEPH_CLIENT", "BERTH_CEPH_KEYRING",
		"BERTH_CEPH_NODE_CLIENT", "BERTH_CEPH_NODE_KEYRING"} {
		if env[k] == "" {
			return nil, fmt.Errorf("%s lacks %s", path, k)
		}
	}
	return env, nil
}

// KeyringKey is the key of a Ceph keyring file (its first "key = " line).
func KeyringKey(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", fmt.Errorf("ceph keyring: %w", err)
	}
	defer func() { _ = f.Close() }()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(strings.TrimSpace(sc.Text()), "=")
		if ok && strings.TrimSpace(k) == "key" && strings.TrimSpace(v) != "" {
			return strings.TrimSpace(v), nil
		}
	}
	if err := sc.Err(); err != nil {
		return "", fmt.Errorf("read %s: %w", path, err)
	}
	return "", fmt.Errorf("%s: %w", path, ErrNoCephKey)
}

// CephSecretManifest is the Secret name with a client of the test Ceph
// (keys as v1.CephSecretUserID/UserKey). It holds the key: never print it.
func CephSecretManifest(name, client, key string) string {
	return fmt.Sprintf(`apiVersion: v1
kind: Secret
metadata: {name: %s, namespace: %s}
type: Opaque
stringData:
  %s: %q
  %s: %q
`, name, Namespace, v1.CephSecretUserID, client, v1.CephSecretUserKey, key)
}

// CephStorageClusterManifest is a ceph StorageCluster named name on the
// test Ceph of cenv, with dataDir (the agent's folder for the cluster). In
// a cluster with multus (publicNAD set) the test Ceph is on the storage
// networks only, so the cluster is on that public network (netns mode:
// the default), or no agent would reach it.
func CephStorageClusterManifest(name, dataDir string, cenv ClusterEnv, publicNAD string) string {
	var network string
	if publicNAD != "" {
		network = fmt.Sprintf("  network:\n    provider: multus\n    selectors: {public: %s}\n", publicNAD)
	}
	return fmt.Sprintf(`apiVersion: berth.io/v1alpha1
kind: StorageCluster
metadata: {name: %s}
spec:
  dataDir: %s
  backend: ceph
  ceph:
    monitors: [%q]
    pool: %s
    secretRef: {name: %s, namespace: %s}
    nodeSecretRef: {name: %s, namespace: %s}
%s`, name, dataDir, cenv["BERTH_CEPH_MONITORS"], cenv["BERTH_CEPH_POOL"], CephSecret, Namespace, CephNodeSecret, Namespace, network)
}

// cephDataDir is the data dir of the ceph StorageCluster name: berth's own
// when berth is the ceph cluster, else a folder of its own in the cluster's
// work dir (data dirs of two clusters must not overlap; down.sh removes it).
func cephDataDir(name string, env ClusterEnv) string {
	if name == StorageCluster {
		return env["BERTH_DATA_DIR"]
	}
	return filepath.Join(env["BERTH_E2E_DIR"], "berth-data-ceph")
}

// publicNAD is the public storage network of a cluster with multus ("":
// none).
func publicNAD(env ClusterEnv) string {
	if env["MULTUS"] != "1" {
		return ""
	}
	return env["PUBLIC_NAD"]
}

// storageClusterManifests are the StorageClusters up applies (with the
// Secret first when any is on Ceph); cenv is nil without the test Ceph.
func (c Config) storageClusterManifests(env, cenv ClusterEnv) ([]string, error) {
	var out []string
	if c.Backend != BackendCeph {
		out = append(out, StorageClusterManifest(env)+ProbeClients(env))
	}
	if !c.needsCeph() {
		return out, nil
	}
	for _, s := range []struct{ name, client, keyring string }{
		{CephSecret, cenv["BERTH_CEPH_CLIENT"], cenv["BERTH_CEPH_KEYRING"]},
		{CephNodeSecret, cenv["BERTH_CEPH_NODE_CLIENT"], cenv["BERTH_CEPH_NODE_KEYRING"]},
	} {
		key, err := KeyringKey(s.keyring)
		if err != nil {
			return nil, err
		}
		out = append(out, CephSecretManifest(s.name, s.client, key))
	}
	for _, name := range c.cephClusters() {
		out = append(out, CephStorageClusterManifest(name, cephDataDir(name, env), cenv, publicNAD(env))+ProbeClients(env))
	}
	return out, nil
}
