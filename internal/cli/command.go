// Package cli holds what every berth command shares: the Command type that
// cmd/berth dispatches to. Each command lives in its own subpackage and turns
// its flags into a Config whose Run does the work.
package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
)

// ErrReported marks a failure the command has already told its caller in
// its own format: cmd/berth exits 1 and prints nothing more (a Flexvolume
// driver's caller, kubelet, parses stdout and stderr as one JSON object).
var ErrReported = errors.New("failure already reported")

// IO is where a command reads and writes.
type IO struct {
	Stdin  io.Reader
	Stdout io.Writer
	Stderr io.Writer
}

// Command is one berth command.
type Command struct {
	// Name is the first argument (or argv[0]) that selects the command.
	Name string
	// Summary is the one line shown by `berth help`.
	Summary string
	// Main parses args (without the command name) and runs the command.
	Main func(ctx context.Context, args []string, stdio IO) error
}

// Runner is a command's parsed configuration.
type Runner interface {
	Run(ctx context.Context) error
}

// ParseThenRun is a Main for a command whose flags parse into a Runner.
func ParseThenRun[R Runner](parse func(args []string, stdio IO) (R, error)) func(context.Context, []string, IO) error {
	return func(ctx context.Context, args []string, stdio IO) error {
		r, err := parse(args, stdio)
		if err != nil {
			return err
		}
		return r.Run(ctx)
	}
}

// FlagCommand is a command whose arguments are flags only. flags defines
// them on fs (named "berth <name>", reporting to stderr) and returns what
// runs once they are parsed; a stray argument is refused, not ignored.
func FlagCommand(name, summary string, flags func(fs *flag.FlagSet, stdio IO) func(ctx context.Context) error) Command {
	return Command{Name: name, Summary: summary, Main: func(ctx context.Context, args []string, stdio IO) error {
		fs := flag.NewFlagSet("berth "+name, flag.ContinueOnError)
		fs.SetOutput(stdio.Stderr)
		run := flags(fs, stdio)
		if err := fs.Parse(args); err != nil {
			return err
		}
		if fs.NArg() > 0 {
			return fmt.Errorf("unexpected arguments: %v", fs.Args())
		}
		return run(ctx)
	}}
}
