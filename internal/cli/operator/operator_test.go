package operator

import (
	"context"
	"flag"
	"io"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/berth-io/berth/internal/cli"
)

func parse(t *testing.T, env map[string]string, args ...string) (Config, error) {
	t.Helper()
	var cfg Config
	fs := flag.NewFlagSet("operator", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	Flags(fs, &cfg, func(k string) string { return env[k] })
	return cfg, fs.Parse(args)
}

func TestFlagsDefaults(t *testing.T) {
	cfg, err := parse(t, nil)
	if err != nil {
		t.Fatal(err)
	}
	o := cfg.Cluster
	if o.Namespace != "berth-system" || o.KubeletDir != "/var/lib/kubelet" || !cfg.LeaderElect || o.ImagePullPolicy != "" {
		t.Errorf("defaults: %+v leaderElect=%v", o, cfg.LeaderElect)
	}
	if err := o.Validate(); err != nil {
		t.Errorf("defaults do not validate: %v", err)
	}
	// Metrics and health are served by default.
	if cfg.MetricsAddr != ":8080" || cfg.HealthAddr != ":8081" || o.MetricsSecure {
		t.Errorf("metrics %q (secure %v) health %q, want plain :8080 and :8081", cfg.MetricsAddr, o.MetricsSecure, cfg.HealthAddr)
	}
	// --metrics-secure is the operator's own and what it renders.
	if cfg, err := parse(t, nil, "--metrics-secure"); err != nil || !cfg.Cluster.MetricsSecure {
		t.Errorf("--metrics-secure: secure %v, %v", cfg.Cluster.MetricsSecure, err)
	}
}

func TestFlagsNamespaceFromEnvAndOverrides(t *testing.T) {
	cfg, err := parse(t, map[string]string{"POD_NAMESPACE": "storage"},
		"--image-pull-policy=Never", "--leader-elect=false", "--kubelet-dir=/k", "--api-server-host=10.0.0.1",
		"--image-pull-secrets=regcred, mirror,")
	if err != nil {
		t.Fatal(err)
	}
	o := cfg.Cluster
	if o.Namespace != "storage" || o.ImagePullPolicy != corev1.PullNever || cfg.LeaderElect || o.KubeletDir != "/k" || o.APIServerHost != "10.0.0.1" {
		t.Errorf("parsed: %+v leaderElect=%v", o, cfg.LeaderElect)
	}
	if want := []corev1.LocalObjectReference{{Name: "regcred"}, {Name: "mirror"}}; !slices.Equal(o.ImagePullSecrets, want) {
		t.Errorf("image pull secrets %v, want %v", o.ImagePullSecrets, want)
	}
}

func TestFlagsRefuseBadInput(t *testing.T) {
	if _, err := parse(t, nil, "--image-pull-policy=Sometimes"); err == nil {
		t.Error("bad pull policy accepted")
	}
	cfg, err := parse(t, nil, "--image=")
	if err != nil {
		t.Fatal(err)
	}
	if err := cfg.Run(context.Background()); err == nil || !strings.Contains(err.Error(), "image") {
		t.Errorf("Run with no image: %v, want an error naming the image", err)
	}
	var stderr strings.Builder
	err = Command().Main(context.Background(), []string{"extra"}, cli.IO{Stderr: &stderr})
	if err == nil || !strings.Contains(err.Error(), "unexpected arguments") {
		t.Errorf("stray argument: %v", err)
	}
}
