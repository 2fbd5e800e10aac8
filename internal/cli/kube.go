package cli

import (
	"flag"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/go-logr/logr"
	"go.uber.org/zap/zapcore"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
)

// APITimeout bounds every request to the API server: an API server that
// stops answering must fail a call, not hang the component. A watch is
// ended by it too and restarted from its last resourceVersion (client-go
// treats the timeout as the watch's normal end), so informers lose nothing.
const APITimeout = 30 * time.Second

// APIQPS and APIBurst are kubelet's defaults: an agent does per node what
// kubelet does, and client-go's own (5, 10) queue a whole node's healing
// after a restart behind its rate limiter (100 volumes took ~18 s).
const (
	APIQPS   = 50
	APIBurst = 100
)

// KubeFlags are the API server flags of every command that talks to one.
type KubeFlags struct {
	// Kubeconfig is the kubeconfig file; "": $KUBECONFIG, else in-cluster.
	Kubeconfig string
	// QPS and Burst are the client-side rate limit.
	QPS   float64
	Burst int
}

// Register adds --kubeconfig, --kube-api-qps and --kube-api-burst to fs,
// with APIQPS and APIBurst as defaults.
func (k *KubeFlags) Register(fs *flag.FlagSet) {
	fs.StringVar(&k.Kubeconfig, "kubeconfig", "", "kubeconfig file (default: $KUBECONFIG or in-cluster)")
	fs.Float64Var(&k.QPS, "kube-api-qps", APIQPS, "requests per second to the API server (client-side limit)")
	fs.IntVar(&k.Burst, "kube-api-burst", APIBurst, "burst of requests to the API server above --kube-api-qps")
}

// RestConfig loads the kubeconfig file when one is named (flag or
// $KUBECONFIG), else the in-cluster service account; requests time out
// after APITimeout and are limited to QPS/Burst (APIQPS/APIBurst when 0).
func (k KubeFlags) RestConfig() (*rest.Config, error) {
	cfg, err := loadRestConfig(k.Kubeconfig)
	if err != nil {
		return nil, err
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = APITimeout
	}
	cfg.QPS, cfg.Burst = APIQPS, APIBurst
	if k.QPS > 0 {
		cfg.QPS = float32(k.QPS)
	}
	if k.Burst > 0 {
		cfg.Burst = k.Burst
	}
	return cfg, nil
}

func loadRestConfig(path string) (*rest.Config, error) {
	if path == "" {
		path = os.Getenv("KUBECONFIG")
	}
	if path != "" {
		cfg, err := clientcmd.BuildConfigFromFlags("", path)
		if err != nil {
			return nil, fmt.Errorf("kubeconfig %s: %w", path, err)
		}
		return cfg, nil
	}
	cfg, err := rest.InClusterConfig()
	if err != nil {
		return nil, fmt.Errorf("no --kubeconfig and not in a cluster: %w", err)
	}
	return cfg, nil
}

// NewLogger returns a structured logger writing to w; verbosity 0 logs Info,
// higher values log V(n) too. Times carry milliseconds: a heal or a
// failover is told by the order of lines within one second.
func NewLogger(w io.Writer, verbosity int, name string) logr.Logger {
	return zap.New(zap.WriteTo(w), zap.Level(zapcore.Level(-verbosity)), zap.UseDevMode(false),
		func(o *zap.Options) { o.TimeEncoder = zapcore.ISO8601TimeEncoder }).WithName(name)
}
