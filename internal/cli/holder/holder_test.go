package holder

import (
	"context"
	"strings"
	"testing"

	"github.com/berth-io/berth/internal/cli"
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
