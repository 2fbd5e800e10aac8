// Package holder is the `berth holder` command: the tiny process of a
// holder pod that keeps the pod's storage network interface for the mover
// and the netns mode.
package holder

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"

	"github.com/go-logr/logr"

	"github.com/berth-io/berth/internal/cli"
	"github.com/berth-io/berth/internal/network"
)

// Config is the holder's flags.
type Config struct {
	// Dir is the hostPath folder the holders and the mover of a node share.
	Dir          string
	PodUID       string
	PodNamespace string
	PodName      string
	// Interface is the storage network interface multus made in the pod.
	Interface string
	// ReadyCheck: only tell whether this pod's holder has published its
	// record (--ready, the readiness probe).
	ReadyCheck bool
	Log        logr.Logger
}

var errNoPodUID = errors.New("berth holder: --pod-uid is required (the downward API's metadata.uid)")

// Run holds until ctx ends (the pod's deletion), then withdraws the record.
func (c Config) Run(ctx context.Context) error {
	if c.PodUID == "" {
		return errNoPodUID
	}
	if c.ReadyCheck {
		return c.checkReady()
	}
	st, err := network.OpenOwnStack()
	if err != nil {
		return err
	}
	defer st.Close()
	h := network.NewHolder(st, network.SelfNSID, network.Dir(c.Dir), c.Log)
	return h.Run(ctx, network.Record{PodUID: c.PodUID, PodNamespace: c.PodNamespace, PodName: c.PodName, Interface: c.Interface})
}

// checkReady passes once the holder of this pod (the probe runs in its
// container: same environment and network namespace) published a record
// of this network namespace: the mover and the netns mode can use it.
func (c Config) checkReady() error {
	rec, err := network.Dir(c.Dir).Read(c.PodUID)
	if err != nil {
		return fmt.Errorf("holder not ready: %w", err)
	}
	self, err := network.SelfNSID()
	if err != nil {
		return fmt.Errorf("own network namespace: %w", err)
	}
	if rec.NetNS != self {
		return fmt.Errorf("holder not ready: the record of pod %s names another network namespace", c.PodUID)
	}
	return nil
}

// Parse turns the command's arguments into a Config.
func Parse(args []string, stdio cli.IO) (Config, error) {
	fs := flag.NewFlagSet("berth holder", flag.ContinueOnError)
	fs.SetOutput(stdio.Stderr)
	cfg := Config{Log: logr.FromSlogHandler(slog.NewTextHandler(stdio.Stderr, nil))}
	fs.StringVar(&cfg.Dir, "dir", network.DefaultDir, "folder shared with the node's mover (hostPath)")
	fs.StringVar(&cfg.PodUID, "pod-uid", os.Getenv("POD_UID"), "this pod's UID (default $POD_UID)")
	fs.StringVar(&cfg.PodNamespace, "pod-namespace", os.Getenv("POD_NAMESPACE"), "this pod's namespace, for messages (default $POD_NAMESPACE)")
	fs.StringVar(&cfg.PodName, "pod-name", os.Getenv("POD_NAME"), "this pod's name, for messages (default $POD_NAME)")
	fs.StringVar(&cfg.Interface, "interface", "net1", "the storage network interface in this pod")
	fs.BoolVar(&cfg.ReadyCheck, "ready", false, "only tell whether this pod's holder published its record (exit 0) or not: the pod's readiness probe")
	if err := fs.Parse(args); err != nil {
		return cfg, err
	}
	if cfg.PodUID == "" {
		return cfg, errNoPodUID
	}
	return cfg, nil
}

// Command is `berth holder`.
func Command() cli.Command {
	return cli.Command{
		Name:    "holder",
		Summary: "hold a pod's storage network interface (multus)",
		Main:    cli.ParseThenRun(Parse),
	}
}
