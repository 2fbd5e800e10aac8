// Package dev is `berth dev up|down`: a throwaway Kubernetes of one or more
// nodes on this machine (hack/cluster) with berth installed, a demo PVC and a pod that
// writes to it; `down` removes all of it.
package dev

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	utilexec "k8s.io/utils/exec"

	"github.com/berth-io/berth/internal/cli"
)

// Actions of `berth dev`.
const (
	ActionUp   = "up"
	ActionDown = "down"
)

// ErrAction means an action other than up or down.
var ErrAction = errors.New("berth dev: want up or down")

// Config is what `berth dev` needs.
type Config struct {
	// Action is ActionUp or ActionDown.
	Action string
	// Repo is the berth source tree holding hack/cluster.
	Repo string
	// BerthBinary is the berth binary the berth image is built from (with
	// the shared libraries it loads).
	BerthBinary string
	// WorkDir is the cluster's folder (cluster.env lives there).
	WorkDir string
	// Demo makes `up` create the demo PVC and writer pod.
	Demo bool
	// Nodes is how many nodes `up` brings up (each its own kubelet and
	// containerd on this machine); the cluster keeps its count until down.
	Nodes int
	// VMNodes is how many VM nodes `up` adds after them: qemu guests with
	// Debian's stock kernel on the cluster's node bridge (hack/vm), for the
	// kernel clients (NFS, nbd, krbd) and a real power-off.
	VMNodes int
	// Backend is the backend of the StorageCluster berth (BackendLocal, or
	// "" for it, or BackendCeph: the test Ceph, hack/cluster/ceph.sh, in the cluster's
	// network).
	Backend string
	// TestCeph starts the test Ceph beside a local berth too, with a ceph
	// StorageCluster CephStorageCluster on it (the e2e scenarios on Ceph).
	TestCeph bool
	// Multus gives the cluster multus, whereabouts and two storage
	// networks (hack/cluster/multus.sh), kept until down.
	Multus bool
	// UnfenceCooldown, when set, is the operator's cool-down before a node
	// back from a loss gets its Ceph clients off the blocklist.
	UnfenceCooldown time.Duration
	// Timeout bounds each wait for the cluster (agent Ready, pod Running).
	Timeout time.Duration
	// Tick is how often a long wait prints that it is still waiting.
	Tick time.Duration
	// Out receives progress lines and the scripts' output.
	Out io.Writer
	// Exec runs the scripts and kubectl.
	Exec utilexec.Interface
}

// Run does c.Action.
func (c Config) Run(ctx context.Context) error {
	switch c.Action {
	case ActionUp:
		return c.up(ctx)
	case ActionDown:
		return c.down(ctx)
	}
	return fmt.Errorf("action %q: %w", c.Action, ErrAction)
}

// ErrNoRepo means Repo is not a berth source tree.
var ErrNoRepo = errors.New("not a berth source tree (no hack/cluster/up.sh)")

func (c Config) script(name string) string { return filepath.Join(c.Repo, "hack", "cluster", name) }

// ErrNodes means a node count below 1 or above what the cluster's address
// plan holds.
var ErrNodes = errors.New("--nodes must be 1 to 9")

// VMTimeout is the default bound of each wait with VM nodes: a VM node
// unpacks the berth image under TCG (over 3 minutes at load 15) before
// its agent starts.
const VMTimeout = 15 * time.Minute

// ErrVMNodes means a VM node count this machine cannot hold (each VM is
// 2 GiB and TCG-emulated cores) or beyond the address plan with --nodes.
var ErrVMNodes = errors.New("--vm-nodes must be 0 to 4, and --nodes plus --vm-nodes at most 9")

func (c Config) check() error {
	if c.Action == ActionUp && c.Backend != "" && c.Backend != BackendLocal && c.Backend != BackendCeph {
		return fmt.Errorf("--backend %q: %w", c.Backend, ErrBackend)
	}
	if c.Nodes < 0 || c.Nodes > 9 {
		return fmt.Errorf("--nodes %d: %w", c.Nodes, ErrNodes)
	}
	if c.VMNodes < 0 || c.VMNodes > 4 || c.Nodes+c.VMNodes > 9 {
		return fmt.Errorf("--vm-nodes %d: %w", c.VMNodes, ErrVMNodes)
	}
	if _, err := os.Stat(c.script("up.sh")); err != nil {
		return fmt.Errorf("--repo %s: %w", c.Repo, ErrNoRepo)
	}
	return nil
}

// progress prints one line with the time since start.
func (c Config) progress(format string, args ...any) {
	fmt.Fprintf(c.Out, "[berth dev] "+format+"\n", args...)
}

// Command is `berth dev`.
func Command() cli.Command {
	return cli.Command{
		Name:    "dev",
		Summary: "bring up (up) or remove (down) a local Kubernetes (--nodes N) with berth (root)",
		Main: func(ctx context.Context, args []string, stdio cli.IO) error {
			if len(args) == 0 || (args[0] != ActionUp && args[0] != ActionDown) {
				fmt.Fprintln(stdio.Stderr, "usage: berth dev up|down [flags]")
				return ErrAction
			}
			fs := flag.NewFlagSet("berth dev "+args[0], flag.ContinueOnError)
			fs.SetOutput(stdio.Stderr)
			self, err := os.Executable()
			if err != nil {
				return fmt.Errorf("find own binary: %w", err)
			}
			cfg := Config{Action: args[0], Out: stdio.Stdout, Exec: utilexec.New(), Tick: 5 * time.Second}
			fs.StringVar(&cfg.Repo, "repo", ".", "berth source tree (holds hack/cluster)")
			fs.StringVar(&cfg.WorkDir, "work-dir", envOr("BERTH_E2E_DIR", "/var/lib/berth-e2e"), "cluster folder (default $BERTH_E2E_DIR)")
			fs.StringVar(&cfg.BerthBinary, "berth-binary", self, "berth binary for the berth image")
			fs.BoolVar(&cfg.Demo, "demo", true, "up: create the demo PVC and writer pod")
			fs.IntVar(&cfg.Nodes, "nodes", 1, "up: number of nodes (each its own kubelet, containerd and namespaces)")
			fs.IntVar(&cfg.VMNodes, "vm-nodes", 0, "up: number of VM nodes after them (qemu with Debian 13's kernel: NFS, nbd, krbd clients, real power-off; hack/vm)")
			fs.StringVar(&cfg.Backend, "backend", BackendLocal, "up: backend of the StorageCluster berth: local, or ceph (a test Ceph in the cluster's network, hack/cluster/ceph.sh)")
			fs.BoolVar(&cfg.TestCeph, "test-ceph", false, "up: also start the test Ceph and a ceph StorageCluster "+CephStorageCluster+" beside a local berth")
			fs.BoolVar(&cfg.Multus, "multus", false, "up: the cluster gets multus (thin plugin), whereabouts and NetworkAttachmentDefinitions default/public and default/cluster on their own bridges (hack/cluster/multus.sh)")
			fs.DurationVar(&cfg.UnfenceCooldown, "unfence-cooldown", 20*time.Second, "up: the operator's cool-down before a node back from a loss leaves Ceph's blocklist (short: a throwaway cluster)")
			fs.DurationVar(&cfg.Timeout, "timeout", 5*time.Minute, "bound of each wait on the cluster (with --vm-nodes, default "+VMTimeout.String()+")")
			if err := fs.Parse(args[1:]); err != nil {
				return err
			}
			timeoutSet := false
			fs.Visit(func(f *flag.Flag) { timeoutSet = timeoutSet || f.Name == "timeout" })
			if cfg.VMNodes > 0 && !timeoutSet {
				cfg.Timeout = VMTimeout
			}
			if cfg.Repo, err = filepath.Abs(cfg.Repo); err != nil {
				return fmt.Errorf("--repo: %w", err)
			}
			return cfg.Run(ctx)
		},
	}
}

func envOr(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}
