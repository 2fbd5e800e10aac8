package cli

import (
	"bytes"
	"context"
	"flag"
	"strings"
	"testing"

	"github.com/go-logr/logr"
	"k8s.io/client-go/rest"
)

// TestFlagCommand: run sees the parsed flags; a stray argument or a bad
// flag is refused before run.
func TestFlagCommand(t *testing.T) {
	var got string
	c := FlagCommand("x", "test", func(fs *flag.FlagSet, _ IO) func(context.Context) error {
		s := fs.String("s", "default", "a flag")
		return func(context.Context) error { got = *s; return nil }
	})
	var stderr bytes.Buffer
	if err := c.Main(t.Context(), []string{"--s=set"}, IO{Stderr: &stderr}); err != nil || got != "set" {
		t.Fatalf("--s=set: ran with %q, %v", got, err)
	}
	got = ""
	if err := c.Main(t.Context(), []string{"extra"}, IO{Stderr: &stderr}); err == nil || !strings.Contains(err.Error(), "extra") || got != "" {
		t.Errorf("stray argument: %v, ran with %q; want refused, not run", err, got)
	}
	if err := c.Main(t.Context(), []string{"--nope"}, IO{Stderr: &stderr}); err == nil || !strings.Contains(stderr.String(), "berth x") {
		t.Errorf("unknown flag: %v, stderr %q; want refused with the command's name", err, stderr.String())
	}
}

// TestKubeCommand: the kube flags and -v come with the command's own.
func TestKubeCommand(t *testing.T) {
	var got *rest.Config
	c := KubeCommand("x", "test", func(fs *flag.FlagSet) KubeRun {
		fs.String("own", "", "the command's own flag")
		return func(_ context.Context, _ logr.Logger, rest *rest.Config) error { got = rest; return nil }
	})
	t.Setenv("KUBECONFIG", writeKubeconfig(t))
	if err := c.Main(t.Context(), []string{"--own=a", "-v=2", "--kube-api-qps=7"}, IO{Stderr: &bytes.Buffer{}}); err != nil {
		t.Fatal(err)
	}
	if got == nil || got.QPS != 7 || got.Timeout != APITimeout {
		t.Errorf("rest config %+v; want qps 7 and the API timeout", got)
	}
}
