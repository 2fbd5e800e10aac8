// Command berth-blockdev is `berth blockdev` alone, built static without the
// ceph backend (`make build` puts it beside bin/berth): the agent runs it,
// when it is there, for the servers of file images (launch.SlimBinary).
//
// Why a second binary: an agent restart starts one server per userspace
// volume at once, and every volume's I/O waits for its own. The multi-call
// berth binary costs about 20 ms of CPU per start before main (dynamic
// linking of librbd/librados, package init of client-go, controller-runtime,
// prometheus), this one about 3 ms (a Go program that does nothing, about
// 1.3 ms); with 100 volumes on 2 cores that difference alone is about a
// second of the heal. It links no Kubernetes package for the same reason
// (TestLinksNoKubernetesPackage): those took it from 3 to 5 ms.
package main

import (
	"context"
	"errors"
	"flag"
	"os"
	"os/signal"
	"syscall"

	"github.com/berth-io/berth/internal/cli"
	"github.com/berth-io/berth/internal/cli/blockdev"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], cli.IO{Stdin: os.Stdin, Stdout: os.Stdout, Stderr: os.Stderr})
	stop()
	switch {
	case err == nil, errors.Is(err, flag.ErrHelp):
	case errors.Is(err, cli.ErrReported):
		os.Exit(1)
	default:
		_, _ = os.Stderr.WriteString("berth-blockdev: " + err.Error() + "\n")
		os.Exit(1)
	}
}

// run takes the command line berth takes after its own name: "blockdev"
// and the flags (launch.Params), so that either binary runs a server.
func run(ctx context.Context, args []string, stdio cli.IO) error {
	c := blockdev.Command()
	if len(args) > 0 && args[0] == c.Name {
		args = args[1:]
	}
	return c.Main(ctx, args, stdio)
}
