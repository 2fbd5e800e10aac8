//go:build e2e

package e2e

import (
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestLoadEnv needs no cluster: it reads a cluster.env as up.sh writes it.
func TestLoadEnv(t *testing.T) {
	path := filepath.Join(t.TempDir(), "cluster.env")
	content := "# comment\nKUBECONFIG=/w/admin.kubeconfig\nNODE_NAME=n1\nBUSYBOX_IMAGE=berth.local/busybox:e2e\n" +
		"KUBELET_ROOT=/w/kubelet\nAPI_SERVER=https://10.250.0.2:443\nBERTH_IMAGE=\n"
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	env, err := LoadEnv(path)
	if err != nil {
		t.Fatal(err)
	}
	if env.Kubeconfig != "/w/admin.kubeconfig" || env.NodeName != "n1" || env.KubeletRoot != "/w/kubelet" ||
		env.APIServer != "https://10.250.0.2:443" || env.BerthImage != "" {
		t.Errorf("env %+v", env)
	}
	if err := os.WriteFile(path, []byte("NODE_NAME=n1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadEnv(path); err == nil {
		t.Error("an env without KUBECONFIG loaded")
	}
}

// TestPercentile needs no cluster: nearest rank, as the bench reports it.
func TestPercentile(t *testing.T) {
	var d []time.Duration
	for i := 20; i >= 1; i-- {
		d = append(d, time.Duration(i)*time.Second)
	}
	if p := percentile(d, 50); p != 10*time.Second {
		t.Errorf("p50 %v", p)
	}
	if p := percentile(d, 99); p != 20*time.Second {
		t.Errorf("p99 %v", p)
	}
	if p := percentile(d[:1], 50); p != 20*time.Second {
		t.Errorf("p50 of one %v", p)
	}
}
