package kube

import (
	"bytes"
	"context"
	"flag"
	"os"
	"path/filepath"
	"testing"

	"github.com/go-logr/logr"
	"k8s.io/client-go/rest"

	"github.com/berth-io/berth/internal/cli"
)

// TestRestConfigTimeout: every component's API requests time out.
func TestRestConfigTimeout(t *testing.T) {
	path := writeKubeconfig(t)
	fs := flag.NewFlagSet("test", flag.ContinueOnError)
	var k Flags
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

// TestCommand: the kube flags and -v come with the command's own.
func TestCommand(t *testing.T) {
	var got *rest.Config
	c := Command("x", "test", func(fs *flag.FlagSet) Run {
		fs.String("own", "", "the command's own flag")
		return func(_ context.Context, _ logr.Logger, rest *rest.Config) error { got = rest; return nil }
	})
	t.Setenv("KUBECONFIG", writeKubeconfig(t))
	if err := c.Main(t.Context(), []string{"--own=a", "-v=2", "--kube-api-qps=7"}, cli.IO{Stderr: &bytes.Buffer{}}); err != nil {
		t.Fatal(err)
	}
	if got == nil || got.QPS != 7 || got.Timeout != APITimeout {
		t.Errorf("rest config %+v; want qps 7 and the API timeout", got)
	}
}
