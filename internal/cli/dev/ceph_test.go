package dev

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/yaml"

	v1 "github.com/berth-io/berth/api/v1alpha1"
	"github.com/berth-io/berth/internal/cli"
)

// Keyrings as ceph-authtool writes them: the operator's client and the
// nodes'.
const (
	testKeyring     = "[client.berth]\n\tkey = AQBkZ2VtAAAAABAAsecretsecretsecret==\n\tcaps mon = \"profile rbd\"\n"
	testNodeKeyring = "[client.berth-node]\n\tkey = AQBkZ2VtAAAAABAAnodenodenodenode==\n\tcaps mon = \"profile rbd\"\n"
)

func cephEnvFile(t *testing.T) ClusterEnv {
	t.Helper()
	dir := t.TempDir()
	keyring, nodeKeyring := filepath.Join(dir, "client.berth.keyring"), filepath.Join(dir, "client.berth-node.keyring")
	for f, k := range map[string]string{keyring: testKeyring, nodeKeyring: testNodeKeyring} {
		if err := os.WriteFile(f, []byte(k), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	env, err := LoadCephEnv(writeEnv(t, "BERTH_CEPH_MONITORS=10.250.1.5:3300\nBERTH_CEPH_POOL=berth\n"+
		"BERTH_CEPH_CLIENT=berth\nBERTH_CEPH_KEYRING="+keyring+"\n"+
		"BERTH_CEPH_NODE_CLIENT=berth-node\nBERTH_CEPH_NODE_KEYRING="+nodeKeyring+"\n"))
	if err != nil {
		t.Fatal(err)
	}
	return env
}

func TestKeyringKey(t *testing.T) {
	env := cephEnvFile(t)
	key, err := KeyringKey(env["BERTH_CEPH_KEYRING"])
	if err != nil || key != "AQBkZ2VtAAAAABAAsecretsecretsecret==" {
		t.Errorf("key %q, %v", key, err)
	}
	empty := filepath.Join(t.TempDir(), "empty.keyring")
	if err := os.WriteFile(empty, []byte("[client.berth]\n\tcaps mon = \"x\"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := KeyringKey(empty); !errors.Is(err, ErrNoCephKey) {
		t.Errorf("keyring without a key: %v, want ErrNoCephKey", err)
	}
	if _, err := LoadCephEnv(writeEnv(t, "BERTH_CEPH_POOL=berth\n")); err == nil {
		t.Error("a ceph.env without monitors loaded")
	}
}

// decoded is what the manifests of up say, decoded as the API server would.
type decoded struct {
	Kind       string            `json:"kind"`
	Metadata   map[string]string `json:"metadata"`
	StringData map[string]string `json:"stringData"`
	Spec       v1.StorageClusterSpec
}

func decodeAll(t *testing.T, manifests []string) []decoded {
	t.Helper()
	var out []decoded
	for _, m := range manifests {
		var d decoded
		if err := yaml.Unmarshal([]byte(m), &d); err != nil {
			t.Fatalf("%v:\n%s", err, m)
		}
		out = append(out, d)
	}
	return out
}

func TestStorageClusterManifestsPerBackend(t *testing.T) {
	env, err := LoadClusterEnv(writeEnv(t, fullEnv))
	if err != nil {
		t.Fatal(err)
	}
	cenv := cephEnvFile(t)
	for _, tc := range []struct {
		name string
		cfg  Config
		want []string // kind/name, in apply order
	}{
		{"local", Config{Backend: BackendLocal}, []string{"StorageCluster/berth"}},
		{"default", Config{}, []string{"StorageCluster/berth"}},
		{"ceph", Config{Backend: BackendCeph}, []string{"Secret/berth-ceph", "Secret/berth-ceph-node", "StorageCluster/berth"}},
		{"local-and-test-ceph", Config{Backend: BackendLocal, TestCeph: true},
			[]string{"StorageCluster/berth", "Secret/berth-ceph", "Secret/berth-ceph-node", "StorageCluster/berth-ceph"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ms, err := tc.cfg.storageClusterManifests(env, cenv)
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, d := range decodeAll(t, ms) {
				got = append(got, d.Kind+"/"+d.Metadata["name"])
				switch {
				case d.Kind == "Secret" && d.Metadata["name"] == CephNodeSecret:
					if d.Metadata["namespace"] != Namespace || d.StringData[v1.CephSecretUserID] != "berth-node" ||
						d.StringData[v1.CephSecretUserKey] != "AQBkZ2VtAAAAABAAnodenodenodenode==" {
						t.Errorf("node Secret %+v", d)
					}
				case d.Kind == "Secret":
					if d.Metadata["namespace"] != Namespace || d.StringData[v1.CephSecretUserID] != "berth" ||
						d.StringData[v1.CephSecretUserKey] != "AQBkZ2VtAAAAABAAsecretsecretsecret==" {
						t.Errorf("Secret %+v", d)
					}
				case d.Spec.Backend == v1.BackendCeph:
					c := d.Spec.Ceph
					if c == nil || len(c.Monitors) != 1 || c.Monitors[0] != "10.250.1.5:3300" || c.Pool != "berth" ||
						c.SecretRef != (v1.CephSecretReference{Name: CephSecret, Namespace: Namespace}) ||
						c.NodeSecretRef == nil || *c.NodeSecretRef != (v1.CephSecretReference{Name: CephNodeSecret, Namespace: Namespace}) {
						t.Errorf("ceph spec %+v", c)
					}
					// Berth's own data dir when berth is the ceph cluster;
					// else one that overlaps no other cluster's.
					want := "/w/berth-data"
					if d.Metadata["name"] != StorageCluster {
						want = "/w/berth-data-ceph"
					}
					if d.Spec.DataDir != want {
						t.Errorf("%s dataDir %q, want %q", d.Metadata["name"], d.Spec.DataDir, want)
					}
				default:
					if d.Spec.DataDir != "/w/berth-data" || d.Spec.Ceph != nil {
						t.Errorf("local cluster %+v", d.Spec)
					}
				}
			}
			if strings.Join(got, " ") != strings.Join(tc.want, " ") {
				t.Errorf("manifests %v, want %v", got, tc.want)
			}
			// up waits for every StorageCluster it applies.
			var clusters []string
			for _, w := range tc.want {
				if name, ok := strings.CutPrefix(w, "StorageCluster/"); ok {
					clusters = append(clusters, name)
				}
			}
			if got := tc.cfg.storageClusters(); strings.Join(got, " ") != strings.Join(clusters, " ") {
				t.Errorf("storageClusters %v, want %v", got, clusters)
			}
		})
	}
}

// TestStorageClusterManifestsMultus: with multus the test Ceph is on the
// storage networks only, so the ceph cluster up makes is on the public one
// (the netns mode, by default) and the local one stays on the host network.
func TestStorageClusterManifestsMultus(t *testing.T) {
	env, err := LoadClusterEnv(writeEnv(t, fullEnv+"MULTUS=1\nPUBLIC_NAD=default/public\n"))
	if err != nil {
		t.Fatal(err)
	}
	ms, err := (Config{TestCeph: true}).storageClusterManifests(env, cephEnvFile(t))
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range decodeAll(t, ms) {
		if d.Kind != "StorageCluster" {
			continue
		}
		n := d.Spec.Network
		onPublic := n.Provider == v1.NetworkProviderMultus && n.Selectors != nil && n.Selectors.Public == "default/public" &&
			n.MultusMode() == v1.MultusModeNetns
		if onPublic != (d.Spec.Backend == v1.BackendCeph) {
			t.Errorf("%s (backend %q) network %+v", d.Metadata["name"], d.Spec.Backend, n)
		}
	}
	args, err := HelmValues(env)
	if err != nil {
		t.Fatal(err)
	}
	got := strings.Join(args, " ")
	if !strings.Contains(got, "operator.networks=default/public") || strings.Contains(got, "hostNetwork") {
		t.Errorf("helm values with multus %q: want the operator on the public network, not the host's", got)
	}
}

func TestDemoClassAndUnfenceInterval(t *testing.T) {
	if c := (Config{Backend: BackendCeph}).demoClass(); c != "berth-userspace" {
		t.Errorf("demo class on ceph %q", c)
	}
	if c := (Config{}).demoClass(); c != "berth" {
		t.Errorf("demo class on local %q", c)
	}
	if d := unfenceInterval(20 * time.Second); d != 5*time.Second {
		t.Errorf("interval %v", d)
	}
	if d := unfenceInterval(time.Second); d != time.Second {
		t.Errorf("interval %v", d)
	}
}

func TestCommandRejectsBadBackend(t *testing.T) {
	var out strings.Builder
	err := Command().Main(context.Background(), []string{"up", "--backend", "nfs", "--repo", t.TempDir()}, cli.IO{Stdout: &out, Stderr: &out})
	if !errors.Is(err, ErrBackend) {
		t.Errorf("up --backend nfs: %v, want ErrBackend", err)
	}
}
