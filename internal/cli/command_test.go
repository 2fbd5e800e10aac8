package cli

import (
	"bytes"
	"context"
	"flag"
	"strings"
	"testing"
)

// TestFlagCommand: run sees the parsed flags; a stray argument or a bad
// flag is refused before run.
func TestFlagCommand(t *testing.T) {
	var got string
	c := FlagCommand("x", "test", func(fs *flag.FlagSet, _ IO) func(context.Context) error {
		s := fs.String("s", "default", "a flag")
		return func(context.Context) error { got = *s; return nil }
	})
	var stderr bytes.Buffer
	if err := c.Main(t.Context(), []string{"--s=set"}, IO{Stderr: &stderr}); err != nil || got != "set" {
		t.Fatalf("--s=set: ran with %q, %v", got, err)
	}
	got = ""
	if err := c.Main(t.Context(), []string{"extra"}, IO{Stderr: &stderr}); err == nil || !strings.Contains(err.Error(), "extra") || got != "" {
		t.Errorf("stray argument: %v, ran with %q; want refused, not run", err, got)
	}
	if err := c.Main(t.Context(), []string{"--nope"}, IO{Stderr: &stderr}); err == nil || !strings.Contains(stderr.String(), "berth x") {
		t.Errorf("unknown flag: %v, stderr %q; want refused with the command's name", err, stderr.String())
	}
}
