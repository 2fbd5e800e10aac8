// Package sharetest runs a real nfs-ganesha on a plain folder for tests
// of NFS clients and of the share server.
package sharetest

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	"golang.org/x/sys/unix"
	"k8s.io/utils/clock"

	"github.com/berth-io/berth/internal/share"
	"github.com/berth-io/berth/internal/share/nfsclient"
)

// Ganesha is a running ganesha serving Dir as /pv1 (on 127.0.0.1 unless
// Options say otherwise).
type Ganesha struct {
	Dir      string
	Endpoint nfsclient.Endpoint
	// Port is where it listens; Server runs it, with its files in State.
	Port   int
	Server *share.Server
	State  share.ServerConfig
}

// Options change what StartWith runs.
type Options struct {
	// BindAddr is where ganesha listens (default 127.0.0.1).
	BindAddr string
	// Clients are admitted besides the local check address.
	Clients []string
	Minors  []int
	// RootSquash maps clients' root to the anonymous user.
	RootSquash bool
}

// StartWith is Start with opts.
func StartWith(t *testing.T, opts Options) *Ganesha {
	t.Helper()
	return start(t, 0, opts)
}

// Start skips the test without root or ganesha, else starts ganesha
// serving the given NFSv4 minor versions (ready when a 4.1 session finds
// the export, or through the 4.0 client when only 0 is served), and stops
// it when the test ends.
func Start(t *testing.T, minors ...int) *Ganesha {
	t.Helper()
	return start(t, 0, Options{Minors: minors})
}

// StartOnTmpfs is Start with the export on a tmpfs of size bytes of its
// own, for tests of a share that fills up.
func StartOnTmpfs(t *testing.T, size int64, minors ...int) *Ganesha {
	t.Helper()
	return start(t, size, Options{Minors: minors})
}

func start(t *testing.T, tmpfsSize int64, opts Options) *Ganesha {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: nfs-ganesha")
	}
	if _, err := exec.LookPath("ganesha.nfsd"); err != nil {
		t.Skipf("needs ganesha.nfsd (hack/install-deps.sh installs nfs-ganesha nfs-ganesha-vfs): %v", err)
	}
	if _, err := os.Stat(filepath.Join(share.PluginsDir, "libfsalvfs.so")); err != nil {
		t.Skipf("needs ganesha's VFS FSAL (nfs-ganesha-vfs): %v", err)
	}
	dir := t.TempDir()
	export := filepath.Join(dir, "export")
	if err := os.MkdirAll(export, 0o755); err != nil {
		t.Fatal(err)
	}
	if tmpfsSize > 0 {
		if err := unix.Mount("tmpfs", export, "tmpfs", 0, fmt.Sprintf("size=%d", tmpfsSize)); err != nil {
			t.Fatalf("mount a tmpfs on the export: %v", err)
		}
		// Registered before ganesha's stop, so it runs after it.
		t.Cleanup(func() {
			if err := unix.Unmount(export, 0); err != nil {
				t.Errorf("unmount the export's tmpfs: %v", err)
			}
		})
	}
	if opts.BindAddr == "" {
		opts.BindAddr = "127.0.0.1"
	}
	minors := opts.Minors
	l, err := net.Listen("tcp", net.JoinHostPort(opts.BindAddr, "0"))
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	_ = l.Close()
	ec := share.ExportConfig{Path: export, Pseudo: "/pv1", BindAddr: opts.BindAddr, Port: port,
		RecoveryRoot: filepath.Join(dir, "rec"), MinorVersions: minors, SyncWrites: true, Clients: opts.Clients, RootSquash: opts.RootSquash}
	g := &Ganesha{Dir: export, Endpoint: nfsclient.Endpoint{Addr: ec.LocalEndpoint(), Export: "/pv1"}, Port: port}
	check := func(ctx context.Context) error {
		return nfsclient.CheckExport41(ctx, g.Endpoint.Addr, g.Endpoint.Export, 1, "sharetest")
	}
	if len(minors) == 1 && minors[0] == 0 {
		cl := nfsclient.New(g.Endpoint, nfsclient.Options{}, clock.RealClock{}, testr.New(t))
		t.Cleanup(cl.Close)
		check = cl.Check
	}
	g.State = share.ServerConfig{Export: ec, Dir: filepath.Join(dir, "state")}
	srv := share.NewServer(g.State, share.OSExec{}, clock.RealClock{}, share.Checks{Export: check}, testr.New(t))
	g.Server = srv
	ctx, cancel := context.WithCancel(context.Background())
	ready, done := make(chan struct{}), make(chan error, 1)
	go func() { done <- srv.Run(ctx, func() { close(ready) }) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("ganesha: %v", err)
		}
	})
	select {
	case <-ready:
	case err := <-done:
		t.Fatalf("ganesha ended before it was ready: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("ganesha not ready in 30s")
	}
	return g
}
