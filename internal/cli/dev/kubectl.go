package dev

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"strings"
	"time"
)

// kubectl runs the cluster's kubectl with its admin kubeconfig.
type kubectl struct {
	cfg Config
	env ClusterEnv
}

// run runs kubectl args with stdin (may be nil) and returns its stdout.
func (k kubectl) run(ctx context.Context, stdin io.Reader, args ...string) (string, error) {
	cmd := k.cfg.Exec.CommandContext(ctx, k.env["KUBECTL"], args...)
	cmd.SetEnv(append(os.Environ(), "KUBECONFIG="+k.env["KUBECONFIG"]))
	var out, errb bytes.Buffer
	cmd.SetStdout(&out)
	cmd.SetStderr(&errb)
	if stdin != nil {
		cmd.SetStdin(stdin)
	}
	if err := cmd.Run(); err != nil {
		return out.String(), fmt.Errorf("kubectl %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(errb.String()))
	}
	return out.String(), nil
}

// waitFor polls check every second until it reports done, printing what it
// waits for every Tick so that a long wait is not silence.
func (c Config) waitFor(ctx context.Context, what string, check func(ctx context.Context) (done bool, state string)) error {
	ctx, cancel := context.WithTimeout(ctx, c.Timeout)
	defer cancel()
	start := time.Now()
	lastTick := start
	state := ""
	for {
		done, s := check(ctx)
		if s != "" {
			state = s
		}
		if done {
			c.progress("  %s: done after %s", what, time.Since(start).Round(100*time.Millisecond))
			return nil
		}
		if time.Since(lastTick) >= c.Tick {
			lastTick = time.Now()
			c.progress("  still waiting for %s (%s): %s", what, time.Since(start).Round(time.Second), state)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("wait for %s (last seen: %s): %w", what, state, ctx.Err())
		case <-time.After(time.Second):
		}
	}
}
