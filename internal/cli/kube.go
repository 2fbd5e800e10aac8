package cli

import (
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

// RestConfig loads a kubeconfig file when path (or $KUBECONFIG) is set,
// else the in-cluster service account; requests time out after APITimeout
// and are limited to APIQPS/APIBurst.
func RestConfig(path string) (*rest.Config, error) {
	cfg, err := loadRestConfig(path)
	if err != nil {
		return nil, err
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = APITimeout
	}
	if cfg.QPS == 0 {
		cfg.QPS, cfg.Burst = APIQPS, APIBurst
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
// higher values log V(n) too.
func NewLogger(w io.Writer, verbosity int, name string) logr.Logger {
	return zap.New(zap.WriteTo(w), zap.Level(zapcore.Level(-verbosity)), zap.UseDevMode(false)).WithName(name)
}
