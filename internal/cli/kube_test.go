package cli

import (
	"flag"
	"os"
	"path/filepath"
	"testing"
)

// TestRestConfigTimeout: every component's API requests time out.
func TestRestConfigTimeout(t *testing.T) {
	path := writeKubeconfig(t)
	fs := flag.NewFlagSet("test", flag.ContinueOnError)
	var k KubeFlags
	k.Register(fs)
	if err := fs.Parse([]string{"--kubeconfig", path}); err != nil {
		t.Fatal(err)
	}
	cfg, err := k.RestConfig()
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Timeout != APITimeout || cfg.QPS != APIQPS || cfg.Burst != APIBurst {
		t.Errorf("rest config timeout %s, qps %v, burst %d; want %s, %d, %d", cfg.Timeout, cfg.QPS, cfg.Burst, APITimeout, APIQPS, APIBurst)
	}
	if err := fs.Parse([]string{"--kube-api-qps", "7", "--kube-api-burst", "9"}); err != nil {
		t.Fatal(err)
	}
	if cfg, err = k.RestConfig(); err != nil || cfg.QPS != 7 || cfg.Burst != 9 {
		t.Errorf("--kube-api-qps 7 --kube-api-burst 9: qps %v, burst %d, %v", cfg.QPS, cfg.Burst, err)
	}
}

// writeKubeconfig writes a kubeconfig of an API server that is never
// reached and returns its path.
func writeKubeconfig(t *testing.T) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "kubeconfig")
	kc := `apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:1"}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
`
	if err := os.WriteFile(path, []byte(kc), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}
