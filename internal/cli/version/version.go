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
	_, err := fmt.Fprintf(c.Out, "berth %s (commit %s, %s)\n", info.Version, info.Commit, info.GoVersion)
	return err
}

// Command is `berth version`.
func Command() cli.Command {
	return cli.FlagCommand("version", "print version, commit and Go version", func(fs *flag.FlagSet, stdio cli.IO) func(context.Context) error {
		cfg := Config{Out: stdio.Stdout}
		fs.BoolVar(&cfg.JSON, "json", false, "print JSON")
		return func(ctx context.Context) error { return cfg.Run(ctx) }
	})
}
