// Package share is the `berth share` command: operator tools for RWX
// shares. `berth share probe nfs://host:port/export` writes a file through
// the export with a userspace NFSv4 client, reads it back and compares.
package share

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/utils/clock"

	"github.com/berth-io/berth/internal/cli"
	"github.com/berth-io/berth/internal/share/nfsclient"
)

// ProbeConfig is `berth share probe`.
type ProbeConfig struct {
	Endpoint nfsclient.Endpoint
	// Size is how many bytes are written.
	Size int
	// Timeout bounds the whole probe, retries through a failover included.
	Timeout time.Duration
	Clock   clock.Clock
	Log     logr.Logger
}

// ProbeResult is what a probe measured.
type ProbeResult struct {
	File        string
	Bytes       int
	Write, Read time.Duration
	SHA256      string
}

// ErrMismatch: the file read back differs from the one written.
var ErrMismatch = errors.New("read back differs from what was written")

// Run writes a file of random bytes, reads it back, compares and removes
// it. The share manager exports with stable writes (--sync-writes), so a
// write that was answered is on the volume's disk: the client library has
// no COMMIT of its own.
func (c ProbeConfig) Run(ctx context.Context) (ProbeResult, error) {
	if c.Clock == nil {
		c.Clock = clock.RealClock{}
	}
	ctx, cancel := context.WithTimeout(ctx, c.Timeout)
	defer cancel()
	data := make([]byte, c.Size)
	_, _ = rand.Read(data)
	sum := sha256.Sum256(data)
	res := ProbeResult{File: ".berth-probe-" + hex.EncodeToString(sum[:6]), Bytes: c.Size, SHA256: hex.EncodeToString(sum[:])}
	cl := nfsclient.New(c.Endpoint, nfsclient.Options{}, c.Clock, c.Log)
	defer cl.Close()
	start := c.Clock.Now()
	if err := cl.WriteFile(ctx, res.File, data); err != nil {
		return res, err
	}
	res.Write = c.Clock.Since(start)
	start = c.Clock.Now()
	got, err := cl.ReadFile(ctx, res.File)
	if err != nil {
		return res, err
	}
	res.Read = c.Clock.Since(start)
	if !bytes.Equal(got, data) {
		g := sha256.Sum256(got)
		return res, fmt.Errorf("%s: %w: wrote %d bytes sha256 %s, read %d bytes sha256 %s",
			res.File, ErrMismatch, len(data), res.SHA256, len(got), hex.EncodeToString(g[:]))
	}
	if err := cl.Remove(ctx, res.File); err != nil {
		return res, err
	}
	return res, nil
}

// Command is `berth share`.
func Command() cli.Command {
	return cli.Command{
		Name:    "share",
		Summary: "RWX share tools: 'share probe nfs://host:port/export' writes, reads back and compares",
		Main: func(ctx context.Context, args []string, stdio cli.IO) error {
			if len(args) == 0 || args[0] != "probe" {
				fmt.Fprintln(stdio.Stderr, "Usage: berth share probe [flags] nfs://host[:port]/export")
				return fmt.Errorf("share: want the subcommand probe")
			}
			fs := flag.NewFlagSet("berth share probe", flag.ContinueOnError)
			fs.SetOutput(stdio.Stderr)
			cfg := ProbeConfig{}
			var verbosity int
			fs.IntVar(&cfg.Size, "size", 1<<20, "bytes to write")
			fs.DurationVar(&cfg.Timeout, "timeout", time.Minute, "give up after this long (retries through a failover included)")
			fs.IntVar(&verbosity, "v", 0, "log verbosity")
			if err := fs.Parse(args[1:]); err != nil {
				return err
			}
			if fs.NArg() != 1 {
				return fmt.Errorf("share probe: want one endpoint nfs://host[:port]/export, got %q", fs.Args())
			}
			ep, err := nfsclient.ParseEndpoint(fs.Arg(0))
			if err != nil {
				return err
			}
			if cfg.Size < 1 {
				return fmt.Errorf("--size %d: at least 1", cfg.Size)
			}
			cfg.Endpoint = ep
			cfg.Log = cli.NewLogger(stdio.Stderr, verbosity, "share-probe")
			res, err := cfg.Run(ctx)
			if err != nil {
				return err
			}
			fmt.Fprintf(stdio.Stdout, "ok %s: wrote %d bytes in %s, read back in %s, sha256 %s\n",
				ep, res.Bytes, res.Write.Round(time.Microsecond), res.Read.Round(time.Microsecond), res.SHA256)
			return nil
		},
	}
}
