// Package version is the `berth version` command.
package version

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"

	"github.com/berth-io/berth/internal/cli"
	buildversion "github.com/berth-io/berth/internal/version"
)

// Config selects the output format.
type Config struct {
	JSON bool
	Out  io.Writer
}

// Run prints the version.
func (c Config) Run(context.Context) error {
	info := buildversion.Get()
	if c.JSON {
		return json.NewEncoder(c.Out).Encode(info)
	}
	backends := "local and ceph backends"
	if !info.Ceph {
		backends = "local backend only"
	}
	_, err := fmt.Fprintf(c.Out, "berth %s (commit %s, %s, %s)\n", info.Version, info.Commit, info.GoVersion, backends)
	return err
}

// Command is `berth version`.
func Command() cli.Command {
	return cli.FlagCommand("version", "print version, commit, Go version and the backends built in", func(fs *flag.FlagSet, stdio cli.IO) func(context.Context) error {
		cfg := Config{Out: stdio.Stdout}
		fs.BoolVar(&cfg.JSON, "json", false, "print JSON")
		return func(ctx context.Context) error { return cfg.Run(ctx) }
	})
}
