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
	"KUBELET_ROOT=/w/kubelet\nVOLUME_PLUGIN_DIR=/w/volume-plugins\nBERTH_IMAGE=berth.local/berth:dev\n"

func TestManifestsRenderEveryDocument(t *testing.T) {
	env, err := LoadClusterEnv(writeEnv(t, fullEnv))
	if err != nil {
		t.Fatal(err)
	}
	m, err := Manifests(env)
	if err != nil {
		t.Fatal(err)
	}
	kinds := map[string]int{}
	for _, doc := range strings.Split(string(m), "\n---\n") {
		var obj struct {
			Kind string `json:"kind"`
		}
		if err := yaml.Unmarshal([]byte(doc), &obj); err != nil {
			t.Fatalf("document does not parse: %v\n%s", err, doc)
		}
		kinds[obj.Kind]++
	}
	for kind, n := range map[string]int{"DaemonSet": 1, "Deployment": 1, "CSIDriver": 1, "StorageClass": 3, "StorageCluster": 1} {
		if kinds[kind] != n {
			t.Errorf("%d %s, want %d (all: %v)", kinds[kind], kind, n, kinds)
		}
	}
	for _, want := range []string{"--kubelet-dir=/w/kubelet", "--volume-plugin-dir=/w/volume-plugins", "--data-dir=/w/berth-data", ProvisionerImage, ResizerImage} {
		if !strings.Contains(string(m), want) {
			t.Errorf("manifests lack %q", want)
		}
	}
}

func TestManifestsNeedBerthImage(t *testing.T) {
	env, err := LoadClusterEnv(writeEnv(t, strings.Replace(fullEnv, "BERTH_IMAGE=berth.local/berth:dev", "BERTH_IMAGE=", 1)))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Manifests(env); err == nil {
		t.Error("rendered without a berth image")
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
	if err := Command().Main(context.Background(), []string{"sideways"}, stdio); err == nil {
		t.Error("berth dev sideways succeeded")
	}
	err := Command().Main(context.Background(), []string{"up", "--repo", t.TempDir()}, stdio)
	if !errors.Is(err, ErrNoRepo) {
		t.Errorf("up in an empty folder: %v, want ErrNoRepo", err)
	}
}
