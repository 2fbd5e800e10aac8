//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/berth-io/berth/internal/cli/dev"
)

// Env is the cluster.env that hack/cluster/up.sh writes.
type Env struct {
	Kubeconfig      string // KUBECONFIG: admin kubeconfig
	APIServer       string // API_SERVER: https://NODE_IP:PORT, reachable from the host and the netns
	NodeName        string // NODE_NAME
	KubeletRoot     string // KUBELET_ROOT: CSI sockets and registration live below it
	VolumePluginDir string // VOLUME_PLUGIN_DIR: Flexvolume drivers
	ContainerdSock  string // CONTAINERD_SOCK: for `ctr images import`
	BusyboxImage    string // BUSYBOX_IMAGE: imported, use imagePullPolicy: Never
	BerthImage      string // BERTH_IMAGE: empty unless up.sh got BERTH_E2E_BERTH_BINARY
	Vars            map[string]string
}

// LoadEnv reads the KEY=value lines of a cluster.env.
func LoadEnv(path string) (Env, error) {
	vars, err := dev.ReadClusterEnv(path)
	if err != nil {
		return Env{}, err
	}
	env := Env{
		Kubeconfig: vars["KUBECONFIG"], APIServer: vars["API_SERVER"], NodeName: vars["NODE_NAME"],
		KubeletRoot: vars["KUBELET_ROOT"], VolumePluginDir: vars["VOLUME_PLUGIN_DIR"],
		ContainerdSock: vars["CONTAINERD_SOCK"], BusyboxImage: vars["BUSYBOX_IMAGE"],
		BerthImage: vars["BERTH_IMAGE"], Vars: vars,
	}
	if env.Kubeconfig == "" || env.NodeName == "" || env.BusyboxImage == "" {
		return Env{}, fmt.Errorf("%s lacks KUBECONFIG, NODE_NAME or BUSYBOX_IMAGE", path)
	}
	return env, nil
}

// Client returns a clientset for the cluster's admin.
func (e Env) Client() (kubernetes.Interface, error) {
	cfg, err := clientcmd.BuildConfigFromFlags("", e.Kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("kubeconfig %s: %w", e.Kubeconfig, err)
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("clientset: %w", err)
	}
	return cs, nil
}

// clientWithRate is Client with a client-side rate limit of qps.
func (e Env) clientWithRate(t *testing.T, qps int) kubernetes.Interface {
	t.Helper()
	cfg, err := clientcmd.BuildConfigFromFlags("", e.Kubeconfig)
	if err != nil {
		t.Fatalf("kubeconfig %s: %v", e.Kubeconfig, err)
	}
	cfg.QPS, cfg.Burst = float32(qps), 2*qps
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatalf("clientset: %v", err)
	}
	return cs
}

// cluster is set once by TestMain; nil when no cluster is available.
var cluster *Env

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	path := os.Getenv("BERTH_E2E_ENV")
	if path == "" {
		path = filepath.Join(envOr("BERTH_E2E_DIR", "/var/lib/berth-e2e"), "cluster.env")
	}
	if os.Getenv("BERTH_E2E_UP") == "1" {
		if err := script(context.Background(), "up.sh"); err != nil {
			fmt.Fprintln(os.Stderr, "e2e: cluster up:", err)
			_ = script(context.Background(), "down.sh")
			return 1
		}
		defer func() {
			if err := script(context.Background(), "down.sh"); err != nil {
				fmt.Fprintln(os.Stderr, "e2e: cluster down:", err)
			}
		}()
	}
	if env, err := LoadEnv(path); err == nil {
		cluster = &env
	} else if os.Getenv("BERTH_E2E_ENV") != "" {
		// Named explicitly (make e2e): a missing cluster is a failure, not a skip.
		fmt.Fprintf(os.Stderr, "e2e: cluster of BERTH_E2E_ENV: %v\n", err)
		return 1
	} else {
		fmt.Fprintf(os.Stderr, "e2e: no cluster (%v): run hack/cluster/up.sh, or set BERTH_E2E_UP=1\n", err)
	}
	return m.Run()
}

// needCluster skips t when no cluster is up.
func needCluster(t *testing.T) (Env, kubernetes.Interface) {
	t.Helper()
	if cluster == nil {
		t.Skip("no e2e cluster: run hack/cluster/up.sh (root), or make e2e")
	}
	cs, err := cluster.Client()
	if err != nil {
		t.Fatal(err)
	}
	return *cluster, cs
}

// script runs hack/cluster/NAME, its output on ours.
func script(ctx context.Context, name string) error {
	path := filepath.Join(repoRoot(), "hack", "cluster", name)
	cmd := exec.CommandContext(ctx, path)
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	return nil
}

func envOr(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}
