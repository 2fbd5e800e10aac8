package dev

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/berth-io/berth/internal/cli"
)

func writeEnv(t *testing.T, content string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "cluster.env")
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

const fullEnv = "# c\nBERTH_E2E_DIR=/w\nKUBECONFIG=/w/admin.kubeconfig\nKUBECTL=/c/kubectl\n" +
	"KUBERNETES_SERVICE_HOST=10.250.0.2\nKUBERNETES_SERVICE_PORT=443\nKUBELET_ROOT=/w/kubelet\nVOLUME_PLUGIN_DIR=/w/volume-plugins\nBERTH_DATA_DIR=/w/berth-data\nBERTH_IMAGE=berth.local/berth:dev\n"

func TestHelmValues(t *testing.T) {
	env, err := LoadClusterEnv(writeEnv(t, fullEnv))
	if err != nil {
		t.Fatal(err)
	}
	args, err := HelmValues(env)
	if err != nil {
		t.Fatal(err)
	}
	got := strings.Join(args, " ")
	for _, want := range []string{"image.registry=berth.local", "image.repository=berth ", "image.tag=dev", "image.pullPolicy=Never",
		"csiSidecars.registry=berth.local",
		"apiServer.host=10.250.0.2", "apiServer.port=443", "kubeletDir=/w/kubelet",
		"volumePluginDir=/w/volume-plugins", "operator.hostNetwork=true"} {
		if !strings.Contains(got, want) {
			t.Errorf("helm values %q lack %q", got, want)
		}
	}
	for _, bad := range []string{"", "berth:dev", "berth.local/berth", "berth.local/:dev", "berth.local/berth:"} {
		if _, err := HelmValues(ClusterEnv{"BERTH_IMAGE": bad, "KUBERNETES_SERVICE_HOST": "h", "KUBERNETES_SERVICE_PORT": "1"}); err == nil {
			t.Errorf("BERTH_IMAGE %q accepted", bad)
		}
	}
	env["BERTH_IMAGE"] = "registry.example:5000/team/berth:v1"
	if args, err = HelmValues(env); err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(args, " "); !strings.Contains(got, "image.registry=registry.example:5000/team --set-string image.repository=berth --set-string image.tag=v1 ") {
		t.Errorf("helm values %q for an image with a port and a path", got)
	}
	var sc struct {
		Kind     string `json:"kind"`
		Metadata struct {
			Name string `json:"name"`
		} `json:"metadata"`
		Spec struct {
			DataDir string `json:"dataDir"`
		} `json:"spec"`
	}
	if err := yaml.Unmarshal([]byte(StorageClusterManifest(env)), &sc); err != nil {
		t.Fatal(err)
	}
	if sc.Kind != "StorageCluster" || sc.Metadata.Name != StorageCluster || sc.Spec.DataDir != "/w/berth-data" {
		t.Errorf("StorageCluster %+v", sc)
	}
}

func TestProbeClientsAdmitThePodNetwork(t *testing.T) {
	var sc struct {
		Spec struct {
			DataDir string `json:"dataDir"`
			RWX     struct {
				ClientCIDRs []string `json:"clientCIDRs"`
			} `json:"rwx"`
		} `json:"spec"`
	}
	for _, tc := range []struct {
		env  ClusterEnv
		want []string
	}{
		{ClusterEnv{"BERTH_DATA_DIR": "/d", "POD_CIDR": "10.251.0.0/16"}, []string{"10.251.0.0/16"}},
		{ClusterEnv{"BERTH_DATA_DIR": "/d", "POD_CIDR": "10.251.0.0/16", "PUBLIC_NET": "10.253.0.0/24"}, []string{"10.251.0.0/16"}},
		{ClusterEnv{"BERTH_DATA_DIR": "/d", "POD_CIDR": "10.251.0.0/16", "PUBLIC_NET": "10.253.0.0/24", "MULTUS": "1"}, []string{"10.251.0.0/16", "10.253.0.0/24"}},
		{ClusterEnv{"BERTH_DATA_DIR": "/d"}, nil},
	} {
		sc.Spec.RWX.ClientCIDRs = nil
		if err := yaml.Unmarshal([]byte(StorageClusterManifest(tc.env)+ProbeClients(tc.env)), &sc); err != nil {
			t.Fatal(err)
		}
		if sc.Spec.DataDir != "/d" || strings.Join(sc.Spec.RWX.ClientCIDRs, ",") != strings.Join(tc.want, ",") {
			t.Errorf("%v: spec %+v, want clientCIDRs %v", tc.env, sc.Spec, tc.want)
		}
	}
}

func TestHelmValuesNeedBerthImage(t *testing.T) {
	env, err := LoadClusterEnv(writeEnv(t, strings.Replace(fullEnv, "BERTH_IMAGE=berth.local/berth:dev", "BERTH_IMAGE=", 1)))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := HelmValues(env); err == nil {
		t.Error("values without a berth image")
	}
}

func TestReadClusterEnvUnquotes(t *testing.T) {
	env, err := ReadClusterEnv(writeEnv(t, "NODES=\"n-1 n-2\"\nNODE_NAME_1=n-1\n"))
	if err != nil {
		t.Fatal(err)
	}
	if env["NODES"] != "n-1 n-2" || env["NODE_NAME_1"] != "n-1" {
		t.Errorf("env %v", env)
	}
}

func TestLoadClusterEnvRequiresKeys(t *testing.T) {
	if _, err := LoadClusterEnv(writeEnv(t, "KUBECONFIG=/x\n")); err == nil {
		t.Error("an env without KUBECTL loaded")
	}
	if _, err := LoadClusterEnv(filepath.Join(t.TempDir(), "none")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("missing file: %v, want ErrNotExist", err)
	}
}

func TestCommandRejectsBadInput(t *testing.T) {
	var out strings.Builder
	stdio := cli.IO{Stdout: &out, Stderr: &out}
	if err := Command().Main(context.Background(), []string{"sideways"}, stdio); !errors.Is(err, ErrAction) {
		t.Errorf("berth dev sideways: %v, want ErrAction", err)
	}
	if err := (Config{Action: "sideways"}).Run(context.Background()); !errors.Is(err, ErrAction) {
		t.Errorf("Run of action sideways: %v, want ErrAction", err)
	}
	err := Command().Main(context.Background(), []string{"up", "--repo", t.TempDir()}, stdio)
	if !errors.Is(err, ErrNoRepo) {
		t.Errorf("up in an empty folder: %v, want ErrNoRepo", err)
	}
	err = Command().Main(context.Background(), []string{"up", "--nodes", "12", "--repo", t.TempDir()}, stdio)
	if !errors.Is(err, ErrNodes) {
		t.Errorf("up --nodes 12: %v, want ErrNodes", err)
	}
	for _, args := range [][]string{{"--vm-nodes", "5"}, {"--vm-nodes", "-1"}, {"--nodes", "8", "--vm-nodes", "2"}} {
		err = Command().Main(context.Background(), append([]string{"up", "--repo", t.TempDir()}, args...), stdio)
		if !errors.Is(err, ErrVMNodes) {
			t.Errorf("up %v: %v, want ErrVMNodes", args, err)
		}
	}
}

func TestCSINodesReady(t *testing.T) {
	for _, c := range []struct {
		list string
		want []string
		ok   bool
	}{
		{"n1=berth.io;n2=;", []string{"n1", "n2"}, false},
		{"n1=berth.io;n2=other berth.io;", []string{"n1", "n2"}, true},
		{"n1=berth.io;", nil, true},
		{"n1=berth.iox;", nil, false},
		{"", []string{"n1"}, false},
	} {
		if got := csiNodesReady(c.list, c.want); got != c.ok {
			t.Errorf("csiNodesReady(%q, %v) = %t, want %t", c.list, c.want, got, c.ok)
		}
	}
}
