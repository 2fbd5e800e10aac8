// Package kube holds what the berth commands that talk to the API server
// share: the kube flags, the client config they make, the logger, and
// Command. It is apart from package cli so that the blockdev server, which
// starts once per volume on every heal, links no Kubernetes client.
package kube

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/zapr"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
	crzap "sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/berth-io/berth/internal/cli"
	"github.com/berth-io/berth/internal/scheme"
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

// Flags are the API server flags of every command that talks to one.
type Flags struct {
	// Kubeconfig is the kubeconfig file; "": $KUBECONFIG, else in-cluster.
	Kubeconfig string
	// QPS and Burst are the client-side rate limit.
	QPS   float64
	Burst int
}

// Register adds --kubeconfig, --kube-api-qps and --kube-api-burst to fs,
// with APIQPS and APIBurst as defaults.
func (k *Flags) Register(fs *flag.FlagSet) {
	fs.StringVar(&k.Kubeconfig, "kubeconfig", "", "kubeconfig file (default: $KUBECONFIG or in-cluster)")
	fs.Float64Var(&k.QPS, "kube-api-qps", APIQPS, "requests per second to the API server (client-side limit)")
	fs.IntVar(&k.Burst, "kube-api-burst", APIBurst, "burst of requests to the API server above --kube-api-qps")
}

// RestConfig loads the kubeconfig file when one is named (flag or
// $KUBECONFIG), else the in-cluster service account; requests time out
// after APITimeout and are limited to QPS/Burst (APIQPS/APIBurst when 0).
func (k Flags) RestConfig() (*rest.Config, error) {
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

// Client is a controller-runtime client with berth's scheme, on
// RestConfig: for commands that read and write once and exit.
func (k Flags) Client() (client.Client, error) {
	rc, err := k.RestConfig()
	if err != nil {
		return nil, err
	}
	s, err := scheme.New()
	if err != nil {
		return nil, err
	}
	c, err := client.New(rc, client.Options{Scheme: s})
	if err != nil {
		return nil, fmt.Errorf("kubernetes client: %w", err)
	}
	return c, nil
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

// NewLogger returns a structured logger writing JSON lines to w;
// verbosity 0 logs Info, higher values log V(n) too. Times carry
// milliseconds: a heal or a failover is told by the order of lines within
// one second. It does not sample, as controller-runtime's production
// logger does (100 lines of one message a second, then 1 in 100): an agent
// restart heals hundreds of volumes in a second and logs a line for each.
func NewLogger(w io.Writer, verbosity int, name string) logr.Logger {
	enc := zap.NewProductionEncoderConfig()
	enc.EncodeTime = zapcore.ISO8601TimeEncoder
	sink := zapcore.AddSync(w)
	core := zapcore.NewCore(&crzap.KubeAwareEncoder{Encoder: zapcore.NewJSONEncoder(enc)}, sink, zapcore.Level(-verbosity))
	return zapr.NewLogger(zap.New(core, zap.AddStacktrace(zapcore.ErrorLevel), zap.ErrorOutput(sink))).WithName(name)
}

// Run runs a command that talks to the API server, with its logger
// (named after the command, at the -v verbosity) and the API server's
// config from the kube flags.
type Run func(ctx context.Context, log logr.Logger, rest *rest.Config) error

// NewCommand is a cli.FlagCommand that talks to the API server: besides the
// flags that flags defines it takes the Flags and -v.
func NewCommand(name, summary string, flags func(fs *flag.FlagSet) Run) cli.Command {
	return cli.FlagCommand(name, summary, func(fs *flag.FlagSet, stdio cli.IO) func(context.Context) error {
		var (
			kf        Flags
			verbosity int
		)
		run := flags(fs)
		kf.Register(fs)
		fs.IntVar(&verbosity, "v", 0, "log verbosity")
		return func(ctx context.Context) error {
			cfg, err := kf.RestConfig()
			if err != nil {
				return err
			}
			log := NewLogger(stdio.Stderr, verbosity, name)
			// client-go and controller-runtime log some lines through their
			// own global loggers (a watch stream that broke, leader
			// election): unset, controller-runtime dropped them and printed
			// a stack trace instead, and klog wrote plain text among the
			// JSON lines.
			ctrllog.SetLogger(log)
			klog.SetLogger(log)
			return run(ctx, log, cfg)
		}
	})
}
