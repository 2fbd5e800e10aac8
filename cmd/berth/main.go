// Command berth is berth's multi-call binary: one binary, one image, every
// component. It dispatches on the name it was run as, then on its first
// argument; each command lives in internal/cli/<command>.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/berth-io/berth/internal/cli"
	"github.com/berth-io/berth/internal/cli/agent"
	"github.com/berth-io/berth/internal/cli/blockdev"
	"github.com/berth-io/berth/internal/cli/csicontroller"
	"github.com/berth-io/berth/internal/cli/dev"
	"github.com/berth-io/berth/internal/cli/flexvolume"
	"github.com/berth-io/berth/internal/cli/holder"
	"github.com/berth-io/berth/internal/cli/keeper"
	"github.com/berth-io/berth/internal/cli/mover"
	"github.com/berth-io/berth/internal/cli/operator"
	"github.com/berth-io/berth/internal/cli/preflight"
	"github.com/berth-io/berth/internal/cli/share"
	"github.com/berth-io/berth/internal/cli/sharemanager"
	"github.com/berth-io/berth/internal/cli/uninstall"
	"github.com/berth-io/berth/internal/cli/version"
)

// commands lists every command that works, in the order `berth help` shows them.
func commands() []cli.Command {
	return []cli.Command{
		agent.Command(),
		csicontroller.Command(),
		operator.Command(),
		flexvolume.Command(),
		keeper.Command(),
		blockdev.Command(),
		sharemanager.Command(),
		share.Command(),
		holder.Command(),
		mover.Command(),
		dev.Command(),
		preflight.Command(),
		uninstall.Command(),
		version.Command(),
	}
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args, cli.IO{Stdin: os.Stdin, Stdout: os.Stdout, Stderr: os.Stderr}, commands())
	stop()
	switch {
	case err == nil:
	case errors.Is(err, flag.ErrHelp):
		os.Exit(0)
	case errors.Is(err, errUsage):
		os.Exit(2)
	case errors.Is(err, cli.ErrReported):
		os.Exit(1)
	default:
		fmt.Fprintf(os.Stderr, "berth: %v\n", err)
		os.Exit(1)
	}
}

var errUsage = errors.New("usage")

// flexvolumeDirSuffix marks kubelet's Flexvolume plugin folder
// (<plugin-dir>/berth.io~berth/berth): kubelet runs the driver by that path.
const flexvolumeDirSuffix = "~berth"

// run selects the command from argv[0] or argv[1] and runs it.
func run(ctx context.Context, argv []string, stdio cli.IO, cmds []cli.Command) error {
	byName := make(map[string]cli.Command, len(cmds))
	for _, c := range cmds {
		byName[c.Name] = c
	}
	name, args := selectCommand(argv, byName)
	if name == "" || name == "help" || name == "-h" || name == "--help" {
		usage(stdio, cmds)
		if name == "" {
			return errUsage
		}
		return nil
	}
	c, ok := byName[name]
	if !ok {
		usage(stdio, cmds)
		return fmt.Errorf("unknown command %q", name)
	}
	return c.Main(ctx, args, stdio)
}

// selectCommand returns the command name and its arguments. argv[0] wins when
// it names a command ("agent", "berth-agent") or sits in a Flexvolume plugin
// folder; otherwise the first argument names it.
func selectCommand(argv []string, byName map[string]cli.Command) (string, []string) {
	if len(argv) == 0 {
		return "", nil
	}
	base := filepath.Base(argv[0])
	if strings.HasSuffix(filepath.Base(filepath.Dir(argv[0])), flexvolumeDirSuffix) {
		return "flexvolume", argv[1:]
	}
	if _, ok := byName[strings.TrimPrefix(base, "berth-")]; ok && base != "berth" {
		return strings.TrimPrefix(base, "berth-"), argv[1:]
	}
	if len(argv) < 2 {
		return "", nil
	}
	return argv[1], argv[2:]
}

func usage(stdio cli.IO, cmds []cli.Command) {
	w := stdio.Stderr
	fmt.Fprintln(w, "berth: storage for Kubernetes nodes")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "Usage: berth <command> [flags]")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "Commands:")
	for _, c := range cmds {
		fmt.Fprintf(w, "  %-16s %s\n", c.Name, c.Summary)
	}
	fmt.Fprintf(w, "  %-16s %s\n", "help", "show this list")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "Run 'berth <command> -h' for a command's flags.")
}
