package sharemanager

import (
	"context"
	"errors"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/berth-io/berth/internal/cli"
	"github.com/berth-io/berth/internal/testenv"
)

func TestParseDefaultsAreFastFailoverOnNFSv41(t *testing.T) {
	cfg, err := parse([]string{"--volume", "pv1", "--device", "/dev/loop7"}, cli.IO{Stderr: io.Discard})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(cfg.MinorVersions, []int{1, 2}) || !cfg.SyncWrites || cfg.GracePeriod != 15*time.Second || cfg.LeaseLifetime != 15*time.Second {
		t.Errorf("defaults: minor %v sync %v grace %s lease %s", cfg.MinorVersions, cfg.SyncWrites, cfg.GracePeriod, cfg.LeaseLifetime)
	}
	if err := cfg.validate(); err != nil {
		t.Errorf("validate: %v", err)
	}
	ep := cfg.export()
	if ep.Pseudo != "/pv1" || ep.RecoveryRoot != "/export/"+RecoveryDirName {
		t.Errorf("export %+v", ep)
	}
}

// TestParseSharingFlags: the flags the operator gives a share manager
// for its clients, root squash and format policy reach its export and
// stage; a client ganesha could not take fails validation.
func TestParseSharingFlags(t *testing.T) {
	cfg, err := parse([]string{"--volume", "pv1", "--device", "/dev/loop7", "--share-manager", "pv1",
		"--clients", "10.88.0.0/16, fd00::/64", "--root-squash", "--never-format", "it is a clone of volume pv0"}, cli.IO{Stderr: io.Discard})
	if err != nil {
		t.Fatal(err)
	}
	ep := cfg.export()
	if cfg.ShareManager != "pv1" || !slices.Equal(ep.Clients, []string{"10.88.0.0/16", "fd00::/64"}) || !ep.RootSquash ||
		cfg.NeverFormat != "it is a clone of volume pv0" {
		t.Errorf("config %+v, export %+v", cfg, ep)
	}
	if err := cfg.validate(); err != nil {
		t.Errorf("validate: %v", err)
	}
	cfg.Clients = []string{"everyone"}
	if err := cfg.validate(); err == nil {
		t.Error("a client that is no address or CIDR passed validation")
	}
}

func TestValidateRefusesBadInput(t *testing.T) {
	for name, args := range map[string][]string{
		"no volume":          {"--device", "/dev/loop7"},
		"volume with slash":  {"--volume", "a/b", "--device", "/dev/loop7"},
		"relative device":    {"--volume", "pv1", "--device", "loop7"},
		"grace below lease":  {"--volume", "pv1", "--device", "/dev/loop7", "--nfs-lease", "20s", "--nfs-grace", "10s"},
		"minor version 3":    {"--volume", "pv1", "--device", "/dev/loop7", "--nfs-minor-versions", "1,3"},
		"relative state dir": {"--volume", "pv1", "--device", "/dev/loop7", "--state-dir", "state"},
	} {
		t.Run(name, func(t *testing.T) {
			cfg, err := parse(args, cli.IO{Stderr: io.Discard})
			if err == nil {
				err = cfg.validate()
			}
			if err == nil {
				t.Fatal("accepted")
			}
		})
	}
	if _, err := parse([]string{"--nfs-minor-versions", "one"}, cli.IO{Stderr: io.Discard}); err == nil || !strings.Contains(err.Error(), "minor") {
		t.Errorf("parse of a bad minor version list = %v", err)
	}
}

// TestReadyCheck: --ready answers from the ready file of --state-dir alone.
func TestReadyCheck(t *testing.T) {
	dir := t.TempDir()
	run := func() error {
		return Command().Main(context.Background(), []string{"--state-dir", dir, "--ready"}, cli.IO{Stderr: io.Discard})
	}
	if err := run(); err == nil {
		t.Error("ready without a ready file")
	}
	if err := os.WriteFile(filepath.Join(dir, "ready"), []byte("/pv1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := run(); err != nil {
		t.Errorf("not ready with a ready file: %v", err)
	}
}

// TestAliveWhileWaitingForTheDevice: the liveness probe (--alive) passes
// while the share manager waits for its device (not ready, not serving),
// fails on a heartbeat older than --alive-within or none, and the
// heartbeat goes when Run returns. The HTTP probes of --health-addr say
// the same: /healthz 200, /readyz 503.
func TestAliveWhileWaitingForTheDevice(t *testing.T) {
	dir := t.TempDir()
	health := "127.0.0.1:" + strconv.Itoa(testenv.FreePort(t))
	probe := func(path string) (int, error) {
		c := http.Client{Timeout: 5 * time.Second}
		resp, err := c.Get("http://" + health + path)
		if err != nil {
			return 0, err
		}
		_ = resp.Body.Close()
		return resp.StatusCode, nil
	}
	alive := func(extra ...string) error {
		args := append([]string{"--state-dir", dir, "--alive"}, extra...)
		return Command().Main(context.Background(), args, cli.IO{Stderr: io.Discard})
	}
	if err := alive(); err == nil {
		t.Error("alive without a heartbeat")
	}
	cfg, err := parse([]string{"--volume", "pv1", "--device", filepath.Join(dir, "no-device"), "--state-dir", dir,
		"--mount-path", filepath.Join(dir, "export"), "--health-addr", health}, cli.IO{Stderr: io.Discard})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- cfg.Run(ctx) }()
	deadline := time.Now().Add(10 * time.Second)
	for alive() != nil && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	if err := alive(); err != nil {
		t.Errorf("not alive while waiting for the device: %v", err)
	}
	if err := Command().Main(context.Background(), []string{"--state-dir", dir, "--ready"}, cli.IO{Stderr: io.Discard}); err == nil {
		t.Error("ready while waiting for the device")
	}
	if code, err := probe("/healthz"); code != http.StatusOK {
		t.Errorf("GET /healthz while waiting for the device: %d, %v", code, err)
	}
	if code, err := probe("/readyz"); code != http.StatusServiceUnavailable {
		t.Errorf("GET /readyz while waiting for the device: %d, %v", code, err)
	}
	old := strconv.FormatInt(time.Now().Add(-2*time.Minute).Unix(), 10)
	if err := os.WriteFile(filepath.Join(dir, "alive"), []byte(old), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := alive(); err == nil || !strings.Contains(err.Error(), "heartbeat") {
		t.Errorf("alive with a heartbeat 2m old: %v", err)
	}
	if code, err := probe("/healthz"); code != http.StatusServiceUnavailable {
		t.Errorf("GET /healthz with a heartbeat 2m old: %d, %v", code, err)
	}
	if err := alive("--alive-within", "3m"); err != nil {
		t.Errorf("not alive with a heartbeat 2m old, 3m allowed: %v", err)
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Errorf("Run = %v, want canceled", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "alive")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("heartbeat left after Run: %v", err)
	}
}
