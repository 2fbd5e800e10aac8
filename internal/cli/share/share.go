// Package share is the `berth share` command: operator tools for RWX
// shares. `berth share probe nfs://host:port/export` writes a file through
// the export with a userspace NFSv4 client, makes it durable (COMMIT),
// reads it back and compares. With --keep it leaves the file there, and
// --verify NAME=SHA256 checks such a file first: data written before a
// failover is read back after it.
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
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/utils/clock"

	"github.com/berth-io/berth/internal/cli"
	"github.com/berth-io/berth/internal/cli/kube"
	"github.com/berth-io/berth/internal/share/nfsclient"
)

// ProbeConfig is `berth share probe`.
type ProbeConfig struct {
	Endpoint nfsclient.Endpoint
	// Size is how many bytes are written.
	Size int
	// Timeout bounds the whole probe, retries through a failover included.
	Timeout time.Duration
	// AttemptTimeout bounds one try of an NFSv4.1+ operation; a hung
	// server is left for a new connection after it (0: the default).
	AttemptTimeout time.Duration
	// MinorVersion is the NFSv4 minor version spoken (0, 1 or 2).
	MinorVersion int
	// Keep, when set, names the file written, which stays in the export.
	Keep string
	// Verify are files (name to SHA-256, hex) read and checked before the
	// write.
	Verify map[string]string
	Clock  clock.Clock
	Log    logr.Logger
}

// ProbeResult is what a probe measured.
type ProbeResult struct {
	File   string
	Bytes  int
	Took   time.Duration
	SHA256 string
}

// ErrMismatch: the file read back differs from the one written.
var ErrMismatch = errors.New("read back differs from what was written")

// Run writes a file of random bytes, makes it durable, reads it back,
// compares and removes it, retrying through a server failover. Over
// NFSv4.1+ (MinorVersion >= 1) it writes unstable and sends COMMIT, the NFS
// fsync; over NFSv4.0 the client library has no COMMIT, and the write is
// durable because the share manager exports with stable writes
// (--sync-writes).
func (c ProbeConfig) Run(ctx context.Context) (ProbeResult, error) {
	if c.Clock == nil {
		c.Clock = clock.RealClock{}
	}
	ctx, cancel := context.WithTimeout(ctx, c.Timeout)
	defer cancel()
	for _, name := range slices.Sorted(maps.Keys(c.Verify)) {
		if err := c.verify(ctx, name, c.Verify[name]); err != nil {
			return ProbeResult{}, err
		}
	}
	data := make([]byte, c.Size)
	_, _ = rand.Read(data)
	sum := sha256.Sum256(data)
	res := ProbeResult{File: ".berth-probe-" + hex.EncodeToString(sum[:6]), Bytes: c.Size, SHA256: hex.EncodeToString(sum[:])}
	if c.Keep != "" {
		res.File = c.Keep
	}
	start := c.Clock.Now()
	got, err := c.roundTrip(ctx, res.File, data)
	res.Took = c.Clock.Since(start)
	if err != nil {
		if c.Keep == "" && ctx.Err() == nil {
			// Failed for good (a full share): what was written would only
			// fill it more.
			if rerr := c.remove(ctx, res.File); rerr != nil {
				c.Log.Error(rerr, "remove the probe's file after the failed probe", "file", res.File)
			}
		}
		return res, err
	}
	if !bytes.Equal(got, data) {
		g := sha256.Sum256(got)
		return res, fmt.Errorf("%s: %w: wrote %d bytes sha256 %s, read %d bytes sha256 %s",
			res.File, ErrMismatch, len(data), res.SHA256, len(got), hex.EncodeToString(g[:]))
	}
	if c.Keep != "" {
		return res, nil
	}
	return res, c.remove(ctx, res.File)
}

// verify reads name and compares its SHA-256 with want.
func (c ProbeConfig) verify(ctx context.Context, name, want string) error {
	var got []byte
	var err error
	if c.MinorVersion == 0 {
		cl := nfsclient.New(c.Endpoint, nfsclient.Options{MachineName: probeMachine}, c.Clock, c.Log)
		defer cl.Close()
		got, err = cl.ReadFile(ctx, name)
	} else {
		err = nfsclient.Retry41(ctx, c.Clock, c.AttemptTimeout, func(ctx context.Context) error {
			got, err = nfsclient.ReadFile41(ctx, c.Endpoint, name, uint32(c.MinorVersion), probeMachine)
			return err
		})
	}
	if err != nil {
		return fmt.Errorf("verify %s: %w", name, err)
	}
	sum := sha256.Sum256(got)
	if hex.EncodeToString(sum[:]) != want {
		return fmt.Errorf("verify %s: %w: read %d bytes sha256 %s, want sha256 %s", name, ErrMismatch, len(got), hex.EncodeToString(sum[:]), want)
	}
	c.Log.Info("verified", "file", name, "bytes", len(got), "sha256", want)
	return nil
}

const probeMachine = "berth-share-probe"

func (c ProbeConfig) roundTrip(ctx context.Context, name string, data []byte) ([]byte, error) {
	if c.MinorVersion == 0 {
		cl := nfsclient.New(c.Endpoint, nfsclient.Options{MachineName: probeMachine}, c.Clock, c.Log)
		defer cl.Close()
		if err := cl.WriteFile(ctx, name, data); err != nil {
			return nil, err
		}
		return cl.ReadFile(ctx, name)
	}
	var got []byte
	err := nfsclient.Retry41(ctx, c.Clock, c.AttemptTimeout, func(ctx context.Context) error {
		var err error
		got, err = nfsclient.WriteCommitRead41(ctx, c.Endpoint, name, data, uint32(c.MinorVersion), probeMachine)
		return err
	})
	return got, err
}

func (c ProbeConfig) remove(ctx context.Context, name string) error {
	if c.MinorVersion == 0 {
		cl := nfsclient.New(c.Endpoint, nfsclient.Options{MachineName: probeMachine}, c.Clock, c.Log)
		defer cl.Close()
		return cl.Remove(ctx, name)
	}
	return nfsclient.Retry41(ctx, c.Clock, c.AttemptTimeout, func(ctx context.Context) error {
		return nfsclient.Remove41(ctx, c.Endpoint, name, uint32(c.MinorVersion), probeMachine)
	})
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
			fs.DurationVar(&cfg.AttemptTimeout, "attempt-timeout", nfsclient.DefaultAttemptTimeout,
				"NFSv4.1+: give up on one try after this long and reconnect (a hung server; berth's kernel mounts use timeo=50, 5s)")
			fs.IntVar(&cfg.MinorVersion, "nfs-minor-version", 1, "NFSv4 minor version: 1 or 2 (COMMIT over a session), 0 (stable writes, no COMMIT)")
			fs.StringVar(&cfg.Keep, "keep", "", "write this file and leave it in the export (for a later --verify)")
			cfg.Verify = map[string]string{}
			fs.Func("verify", "NAME=SHA256: read this file first and compare (repeatable)", func(v string) error {
				name, sum, ok := strings.Cut(v, "=")
				if _, err := hex.DecodeString(sum); !ok || name == "" || len(sum) != 2*sha256.Size || err != nil {
					return fmt.Errorf("want NAME=SHA256 (64 hex digits), got %q", v)
				}
				cfg.Verify[name] = strings.ToLower(sum)
				return nil
			})
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
			if cfg.MinorVersion < 0 || cfg.MinorVersion > 2 {
				return fmt.Errorf("--nfs-minor-version %d: 0, 1 or 2", cfg.MinorVersion)
			}
			cfg.Endpoint = ep
			cfg.Log = kube.NewLogger(stdio.Stderr, verbosity, "share-probe")
			res, err := cfg.Run(ctx)
			if err != nil {
				return err
			}
			for _, name := range slices.Sorted(maps.Keys(cfg.Verify)) {
				fmt.Fprintf(stdio.Stdout, "verified %s sha256 %s\n", name, cfg.Verify[name])
			}
			fmt.Fprintf(stdio.Stdout, "ok %s: wrote, committed and read back %d bytes in %s, sha256 %s\n",
				ep, res.Bytes, res.Took.Round(time.Microsecond), res.SHA256)
			if cfg.Keep != "" {
				fmt.Fprintf(stdio.Stdout, "kept %s sha256 %s\n", res.File, res.SHA256)
			}
			return nil
		},
	}
}
