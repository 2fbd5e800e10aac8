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
	// The default build, and the one that serves RBD images (librbd).
	for _, tags := range []string{"", "ceph,pacific"} {
		out, err := exec.Command(goTool, "list", "-tags", tags, "-deps", ".").Output()
		if err != nil {
			t.Fatalf("go list -tags %q -deps: %v", tags, err)
		}
		for _, pkg := range strings.Fields(string(out)) {
			if strings.HasPrefix(pkg, "k8s.io/") || strings.HasPrefix(pkg, "sigs.k8s.io/") ||
				strings.HasPrefix(pkg, "github.com/berth-io/berth/api/") {
				t.Errorf("berth-blockdev (tags %q) links %s: see the package comment", tags, pkg)
			}
		}
	}
}
