package main

import (
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// TestLinksNoKubernetesPackage: the server binary starts once per volume
// on every heal, and the init of the Kubernetes client and API packages
// was most of its start-up cost.
func TestLinksNoKubernetesPackage(t *testing.T) {
	goTool, err := exec.LookPath("go")
	if err != nil && runtime.GOROOT() != "" {
		goTool, err = filepath.Join(runtime.GOROOT(), "bin", "go"), nil
	}
	if err != nil {
		t.Skip("no go tool on PATH (and no GOROOT): cannot list the binary's packages")
	}
	out, err := exec.Command(goTool, "list", "-deps", ".").Output()
	if err != nil {
		t.Fatalf("go list -deps: %v", err)
	}
	for _, pkg := range strings.Fields(string(out)) {
		if strings.HasPrefix(pkg, "k8s.io/") || strings.HasPrefix(pkg, "sigs.k8s.io/") ||
			strings.HasPrefix(pkg, "github.com/berth-io/berth/api/") {
			t.Errorf("berth-blockdev links %s: see the package comment", pkg)
		}
	}
}
