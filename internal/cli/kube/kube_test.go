package kube

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/go-logr/logr"
	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

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

// TestNewCommand: the kube flags and -v come with the command's own, and
// what client-go and controller-runtime log through their global loggers
// (a watch stream that broke) reaches the command's JSON log, not a stack
// trace about an unset logger. (controller-runtime's logger is set once
// per process: this is the package's only test that runs a command.)
func TestNewCommand(t *testing.T) {
	var got *rest.Config
	var stderr bytes.Buffer
	c := NewCommand("x", "test", func(fs *flag.FlagSet) Run {
		fs.String("own", "", "the command's own flag")
		return func(_ context.Context, _ logr.Logger, rest *rest.Config) error {
			got = rest
			ctrllog.Log.Info("from controller-runtime")
			klog.Background().Info("from klog")
			return nil
		}
	})
	t.Setenv("KUBECONFIG", writeKubeconfig(t))
	if err := c.Main(t.Context(), []string{"--own=a", "-v=2", "--kube-api-qps=7"}, cli.IO{Stderr: &stderr}); err != nil {
		t.Fatal(err)
	}
	if got == nil || got.QPS != 7 || got.Timeout != APITimeout {
		t.Errorf("rest config %+v; want qps 7 and the API timeout", got)
	}
	for _, want := range []string{`"msg":"from controller-runtime"`, `"msg":"from klog"`} {
		if !strings.Contains(stderr.String(), want) {
			t.Errorf("the command's log lacks %s:\n%s", want, stderr.String())
		}
	}
}

// TestNewLoggerKeepsEveryLine: a burst of one message (a heal of hundreds
// of volumes) is logged in full, with millisecond times, V(n) only at -v n.
func TestNewLoggerKeepsEveryLine(t *testing.T) {
	var out bytes.Buffer
	log := NewLogger(&out, 1, "agent")
	for i := range 500 {
		log.Info("healed", "volume", i)
	}
	log.V(1).Info("verbose")
	log.V(2).Info("too verbose")
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 501 {
		t.Fatalf("%d lines logged, want 501", len(lines))
	}
	var first struct{ Level, TS, Logger, Msg string }
	if err := json.Unmarshal([]byte(lines[0]), &first); err != nil {
		t.Fatal(err)
	}
	if first.Level != "info" || first.Logger != "agent" || first.Msg != "healed" || !regexp.MustCompile(`T\d\d:\d\d:\d\d\.\d{3}`).MatchString(first.TS) {
		t.Errorf("first line %s", lines[0])
	}
	if !strings.Contains(lines[500], `"verbose"`) {
		t.Errorf("last line %s; want the V(1) line", lines[500])
	}
}
