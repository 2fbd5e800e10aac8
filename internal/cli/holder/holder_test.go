package holder

import (
	"context"
	"strings"
	"testing"

	"github.com/berth-io/berth/internal/cli"
	"github.com/berth-io/berth/internal/network"
)

func TestParse(t *testing.T) {
	t.Setenv("POD_UID", "uid-from-env")
	var stderr strings.Builder
	cfg, err := Parse([]string{"--dir=/tmp/h", "--interface=net2", "--pod-name=holder-x"}, cli.IO{Stderr: &stderr})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Dir != "/tmp/h" || cfg.Interface != "net2" || cfg.PodUID != "uid-from-env" || cfg.PodName != "holder-x" {
		t.Errorf("Parse = %+v", cfg)
	}
}

func TestRunWantsPodUID(t *testing.T) {
	if err := (Config{Dir: t.TempDir(), Interface: "net1"}).Run(context.Background()); err == nil || !strings.Contains(err.Error(), "--pod-uid") {
		t.Errorf("Run without a pod UID: %v", err)
	}
	t.Setenv("POD_UID", "")
	if _, err := Parse(nil, cli.IO{Stderr: &strings.Builder{}}); err == nil || !strings.Contains(err.Error(), "--pod-uid") {
		t.Errorf("Parse without a pod UID: %v", err)
	}
}

// TestReadyCheck: --ready passes only once a record of this pod and this
// network namespace is published (the holder's readiness probe).
func TestReadyCheck(t *testing.T) {
	dir := t.TempDir()
	t.Setenv("POD_UID", "u1")
	ready := func() error {
		return Command().Main(context.Background(), []string{"--dir=" + dir, "--ready"}, cli.IO{Stderr: &strings.Builder{}})
	}
	if err := ready(); err == nil {
		t.Error("ready without a record")
	}
	self, err := network.SelfNSID()
	if err != nil {
		t.Fatal(err)
	}
	other := self
	other.Ino++
	if err := network.Dir(dir).Write(network.Record{PodUID: "u1", Interface: "net1", NetNS: other}); err != nil {
		t.Fatal(err)
	}
	if err := ready(); err == nil || !strings.Contains(err.Error(), "another network namespace") {
		t.Errorf("ready with a record of another namespace: %v", err)
	}
	if err := network.Dir(dir).Write(network.Record{PodUID: "u1", Interface: "net1", NetNS: self}); err != nil {
		t.Fatal(err)
	}
	if err := ready(); err != nil {
		t.Errorf("not ready with its record: %v", err)
	}
}
