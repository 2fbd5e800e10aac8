package cli

import (
	"os"
	"path/filepath"
	"testing"
)

// TestRestConfigTimeout: every component's API requests time out.
func TestRestConfigTimeout(t *testing.T) {
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
	cfg, err := RestConfig(path)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Timeout != APITimeout {
		t.Errorf("rest config timeout = %s, want %s", cfg.Timeout, APITimeout)
	}
}
