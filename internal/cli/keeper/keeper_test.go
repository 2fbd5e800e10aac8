package keeper

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"

	"github.com/berth-io/berth/internal/cli"
	"github.com/berth-io/berth/internal/testenv"
)

// TestPingIsTheReadinessProbe runs a real keeper and the probe command the
// keeper pod's readiness probe runs: it succeeds against the live keeper and
// fails, naming the socket, where no keeper listens.
func TestPingIsTheReadinessProbe(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("the keeper admits only root peers; run as root")
	}
	sock := filepath.Join(t.TempDir(), "keeper.sock")
	testenv.Serve(t, "keeper", Config{Socket: sock, Log: logr.Discard()}.Run)
	probe := func(socket string) error {
		var stderr strings.Builder
		return Command().Main(context.Background(), []string{"--socket=" + socket, "--ping"}, cli.IO{Stderr: &stderr})
	}
	deadline := time.Now().Add(10 * time.Second)
	for probe(sock) != nil {
		if time.Now().After(deadline) {
			t.Fatalf("probe against the running keeper: %v", probe(sock))
		}
		time.Sleep(50 * time.Millisecond)
	}
	missing := filepath.Join(t.TempDir(), "none.sock")
	if err := probe(missing); err == nil || !strings.Contains(err.Error(), missing) {
		t.Errorf("probe with no keeper: %v, want an error naming %s", err, missing)
	}
}
