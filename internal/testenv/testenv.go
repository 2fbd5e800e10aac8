// Package testenv starts a real kube-apiserver + etcd (controller-runtime's
// envtest) with berth's CRDs installed, for tests that need an API server.
//
// The binaries come from hack/kube-binaries.sh (built from the Go module
// proxy, cached by version). KUBEBUILDER_ASSETS wins when set; otherwise the
// script is run, which only checks its cache after the first build.
package testenv

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/go-logr/logr"
	"golang.org/x/mod/modfile"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/berth-io/berth/internal/scheme"
)

// Env is a running API server with berth's CRDs.
type Env struct {
	Config *rest.Config
	Client client.Client
	Scheme *runtime.Scheme
	env    *envtest.Environment
}

// RepoRoot is the berth source tree the test runs in.
//
// BERTH_TEST_REPO_ROOT replaces it where the test binary runs away from the
// source tree (a VM test node); it needs only the files the tests read
// (config/crd/bases). Otherwise it is the nearest folder above the working
// directory (go test runs a test in its package's folder) whose go.mod is
// berth's. Not the source path compiled in: the tests build with -trimpath,
// as `make build` does, so that both share one build cache.
func RepoRoot() string {
	if root := os.Getenv("BERTH_TEST_REPO_ROOT"); root != "" {
		return root
	}
	dir, err := os.Getwd()
	if err != nil {
		panic(fmt.Sprintf("testenv: the working directory: %v", err))
	}
	for d := dir; ; d = filepath.Dir(d) {
		if b, err := os.ReadFile(filepath.Join(d, "go.mod")); err == nil && modfile.ModulePath(b) == "github.com/berth-io/berth" {
			return d
		}
		if filepath.Dir(d) == d {
			panic(fmt.Sprintf("testenv: no berth go.mod above %s; run the test in the source tree or set BERTH_TEST_REPO_ROOT", dir))
		}
	}
}

// Assets returns the folder with kube-apiserver and etcd, building them once.
func Assets() (string, error) {
	if dir := os.Getenv("KUBEBUILDER_ASSETS"); dir != "" {
		return dir, nil
	}
	var stdout, stderr bytes.Buffer
	cmd := exec.Command(filepath.Join(RepoRoot(), "hack", "kube-binaries.sh"))
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("hack/kube-binaries.sh: %w\n%s", err, stderr.String())
	}
	lines := strings.Split(strings.TrimSpace(stdout.String()), "\n")
	return lines[len(lines)-1], nil
}

// Start starts kube-apiserver and etcd and installs the CRDs.
func Start() (*Env, error) {
	assets, err := Assets()
	if err != nil {
		return nil, err
	}
	s, err := scheme.New()
	if err != nil {
		return nil, err
	}
	// envtest logs through controller-runtime's logger; without one it
	// prints a warning with a stack trace into every test's output.
	ctrllog.SetLogger(logr.Discard())
	e := &envtest.Environment{
		BinaryAssetsDirectory: assets,
		CRDDirectoryPaths:     []string{filepath.Join(RepoRoot(), "config", "crd", "bases")},
		ErrorIfCRDPathMissing: true,
		Scheme:                s,
	}
	// kube-apiserver picks its advertised address from the default route;
	// a VM test node has none (no traffic leaves it), so name one.
	e.ControlPlane.GetAPIServer().Configure().Set("advertise-address", "127.0.0.1")
	cfg, err := e.Start()
	if err != nil {
		// Start fails after starting the processes when, say, a CRD is
		// refused: stop them, or they outlive the test.
		_ = e.Stop()
		return nil, fmt.Errorf("start envtest (kube-apiserver + etcd from %s): %w", assets, err)
	}
	c, err := client.NewWithWatch(cfg, client.Options{Scheme: s})
	if err != nil {
		_ = e.Stop()
		return nil, err
	}
	return &Env{Config: cfg, Client: c, Scheme: s, env: e}, nil
}

// Stop stops the API server and etcd.
func (e *Env) Stop() error { return e.env.Stop() }

// Scheme returns the scheme berth's components use (internal/scheme).
func Scheme() (*runtime.Scheme, error) { return scheme.New() }

// WriteKubeconfig writes a kubeconfig for the API server, so that berth's
// commands can run as separate processes against it.
func (e *Env) WriteKubeconfig(path string) error {
	c := e.Config
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["envtest"] = &clientcmdapi.Cluster{Server: c.Host, CertificateAuthorityData: c.CAData}
	cfg.AuthInfos["envtest"] = &clientcmdapi.AuthInfo{ClientCertificateData: c.CertData, ClientKeyData: c.KeyData, Token: c.BearerToken}
	cfg.Contexts["envtest"] = &clientcmdapi.Context{Cluster: "envtest", AuthInfo: "envtest"}
	cfg.CurrentContext = "envtest"
	return clientcmd.WriteToFile(*cfg, path)
}

// CephTags are the build tags of berth with the ceph backend, as the
// Makefile's CEPH_TAGS: netgo,osusergo keep every pure-Go package compiled
// as in a static build, so both share the Go build cache.
const CephTags = "ceph,pacific,netgo,osusergo"

// BuildBerth builds the berth binary into dir, as `make build` does, and
// returns its path: with the ceph backend (cgo against Debian's librbd and
// librados), or static without it when BERTH_CEPH=0 (`make build CEPH=0`).
//
// BERTH_TEST_BIN_DIR names a folder that holds berth and berth-blockdev
// built already: a test binary run where there is no Go toolchain (a VM
// test node, test/e2e's VMSanity) uses them instead.
func BuildBerth(dir string) (string, error) {
	if bin := os.Getenv("BERTH_TEST_BIN_DIR"); bin != "" {
		out := filepath.Join(bin, "berth")
		for _, f := range []string{out, filepath.Join(bin, "berth-blockdev")} {
			if _, err := os.Stat(f); err != nil {
				return "", fmt.Errorf("BERTH_TEST_BIN_DIR=%s: %w", bin, err)
			}
		}
		return out, nil
	}
	out := filepath.Join(dir, "berth")
	// -trimpath as in the Makefile: the same flags reuse what make build
	// and the test binaries compiled (another set compiles every
	// dependency again, minutes on a cold machine).
	args, env := []string{"build", "-trimpath", "-tags", CephTags}, "CGO_ENABLED=1"
	if os.Getenv("BERTH_CEPH") == "0" {
		args, env = []string{"build", "-trimpath"}, "CGO_ENABLED=0"
	}
	cmd := exec.Command("go", append(args, "-o", out, "./cmd/berth")...)
	cmd.Dir = RepoRoot()
	cmd.Env = append(os.Environ(), env)
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go %s ./cmd/berth: %w (hack/install-deps.sh --ceph-build installs the Ceph libraries; BERTH_CEPH=0 builds without them)\n%s",
			strings.Join(args, " "), err, b)
	}
	// The slim server binary beside it, as `make build` puts it: the
	// agent runs it for file images when it is there. Its name is
	// launch.SlimBinaryName (not imported: launch's tests import testenv).
	cmd = exec.Command("go", "build", "-trimpath", "-o", filepath.Join(dir, "berth-blockdev"), "./cmd/berth-blockdev")
	cmd.Dir = RepoRoot()
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build -trimpath ./cmd/berth-blockdev: %w\n%s", err, b)
	}
	// And its ceph build (launch.CephBinaryName), which serves rbd images.
	if os.Getenv("BERTH_CEPH") != "0" {
		cmd = exec.Command("go", "build", "-trimpath", "-tags", CephTags, "-o", filepath.Join(dir, "berth-blockdev-ceph"), "./cmd/berth-blockdev")
		cmd.Dir = RepoRoot()
		cmd.Env = append(os.Environ(), "CGO_ENABLED=1")
		if b, err := cmd.CombinedOutput(); err != nil {
			return "", fmt.Errorf("go build -trimpath -tags %s ./cmd/berth-blockdev: %w\n%s", CephTags, err, b)
		}
	}
	return out, nil
}

// BerthHost is where a test package runs berth's own processes against the
// API server, as one node: a folder (under the temp dir, not a test's:
// the package removes the mounts below it itself), berth built there and a
// kubeconfig of the API server there.
type BerthHost struct {
	Dir, Berth, Kubeconfig string
}

// NewBerthHost makes a BerthHost in a new folder named prefix* and the Node
// object node. On an error the folder, if made, is in Dir for the caller
// to remove.
func (e *Env) NewBerthHost(prefix, node string) (BerthHost, error) {
	dir, err := os.MkdirTemp("", prefix)
	if err != nil {
		return BerthHost{}, err
	}
	h := BerthHost{Dir: dir, Kubeconfig: filepath.Join(dir, "kubeconfig")}
	if h.Berth, err = BuildBerth(dir); err != nil {
		return h, err
	}
	if err := e.WriteKubeconfig(h.Kubeconfig); err != nil {
		return h, err
	}
	return h, e.Client.Create(context.Background(), &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node}})
}

// NodeSkipReason says why a test of real node work (mounts, loop devices,
// FUSE) cannot run here: -short, not root, or a device node missing; ""
// when it can. Call it after flag.Parse.
func NodeSkipReason(devices ...string) string {
	switch {
	case testing.Short():
		return "-short: needs a real API server, root and kernel devices"
	case os.Geteuid() != 0:
		return "needs root: it makes loop devices, filesystems and mounts"
	}
	for _, d := range devices {
		if _, err := os.Stat(d); err != nil {
			return "needs " + d + ", which is missing here"
		}
	}
	return ""
}
