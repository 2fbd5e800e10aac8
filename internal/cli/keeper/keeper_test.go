package keeper

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/go-logr/logr"

	"github.com/berth-io/berth/internal/cli"
	"github.com/berth-io/berth/internal/keeper"
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

// TestProbeReadyOnceTakenOver runs a keeper in a mount namespace of its
// own, as the old keeper's container is: the probe of this "container"
// fails while that keeper answers, and succeeds once the keeper started
// here took over. The same over HTTP (the pod's probe, /readyz on
// --health-addr): the old keeper is ready until it hands over, the new one
// from its take-over. The old keeper then holds nothing, stays until
// stopped, and exits 0 at once.
func TestProbeReadyOnceTakenOver(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("the keeper admits only root peers, and a mount namespace needs root; run as root")
	}
	sock := filepath.Join(t.TempDir(), "keeper.sock")
	logFile, err := os.Create(filepath.Join(t.TempDir(), "old.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer logFile.Close()
	oldLog := func() string { b, _ := os.ReadFile(logFile.Name()); return string(b) }
	old := exec.Command(os.Args[0], "-test.run=^TestHelperKeeper$")
	oldHealth, newHealth := freeAddr(t), freeAddr(t)
	old.Env = append(os.Environ(), "KEEPER_HELPER_SOCKET="+sock, "KEEPER_HELPER_HEALTH="+oldHealth)
	old.Stderr = logFile
	old.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNS}
	if err := old.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- old.Wait() }()
	t.Cleanup(func() { _ = old.Process.Kill() })
	probe := func() error {
		var stderr strings.Builder
		return Command().Main(context.Background(), []string{"--socket=" + sock, "--ping"}, cli.IO{Stderr: &stderr})
	}
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(50 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("%s; old keeper's log:\n%s", what, oldLog())
			}
		}
	}
	waitFor("old keeper does not answer", func() bool { return keeper.NewClient(sock).Ping(context.Background()) == nil })
	if err := probe(); err == nil || !strings.Contains(err.Error(), "not from this container") {
		t.Fatalf("probe while another container's keeper answers: %v", err)
	}
	waitFor("old keeper's /readyz not 200 while it serves", func() bool { return readyz(oldHealth) == http.StatusOK })
	testenv.Serve(t, "keeper", Config{Socket: sock, HealthAddr: newHealth, Log: logr.Discard()}.Run)
	waitFor("probe fails after the take-over", func() bool { return probe() == nil })
	waitFor("new keeper's /readyz not 200 after the take-over", func() bool { return readyz(newHealth) == http.StatusOK })
	if code := readyz(oldHealth); code != http.StatusServiceUnavailable {
		t.Errorf("old keeper's /readyz after its hand-over: %d, want 503", code)
	}
	select {
	case err := <-exited:
		t.Fatalf("the old keeper exited before it was stopped (its container would restart): %v", err)
	case <-time.After(200 * time.Millisecond):
	}
	_ = old.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-exited:
		if err != nil {
			t.Fatalf("old keeper: %v\n%s", err, oldLog())
		}
	case <-time.After(3 * time.Second):
		t.Fatal("the old keeper did not exit at once when stopped after its hand-over")
	}
	if !strings.Contains(oldLog(), "handed over") {
		t.Errorf("old keeper's log does not say it handed over:\n%s", oldLog())
	}
}

// TestHelperKeeper is the old keeper of TestProbeReadyOnceTakenOver.
func TestHelperKeeper(t *testing.T) {
	sock := os.Getenv("KEEPER_HELPER_SOCKET")
	if sock == "" {
		t.Skip("helper process of TestProbeReadyOnceTakenOver")
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	cfg := Config{Socket: sock, HealthAddr: os.Getenv("KEEPER_HELPER_HEALTH"), HandOverWait: time.Second, Log: logr.FromSlogHandler(slog.NewTextHandler(os.Stderr, nil))}
	if err := cfg.Run(ctx); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	os.Exit(0)
}

// freeAddr is a 127.0.0.1 address with a port free just now.
func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// readyz is the status of GET /readyz at addr (0: no answer).
func readyz(addr string) int {
	c := http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get("http://" + addr + "/readyz")
	if err != nil {
		return 0
	}
	_ = resp.Body.Close()
	return resp.StatusCode
}
