package mover

import (
	"strings"
	"testing"
	"time"

	"github.com/berth-io/berth/internal/cli"
)

func TestParse(t *testing.T) {
	var stderr strings.Builder
	cfg, err := Parse([]string{"--dir=/tmp/h", "--interval=2s"}, cli.IO{Stderr: &stderr})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Dir != "/tmp/h" || cfg.Proc != "/proc" || cfg.Interval != 2*time.Second {
		t.Errorf("Parse = %+v", cfg)
	}
	if _, err := Parse([]string{"--nope"}, cli.IO{Stderr: &stderr}); err == nil {
		t.Error("unknown flag accepted")
	}
}
