package share

import (
	"context"
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	"k8s.io/utils/clock"

	"github.com/berth-io/berth/internal/share/nfsclient"
)

func needGanesha(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: nfs-ganesha")
	}
	if _, err := exec.LookPath("ganesha.nfsd"); err != nil {
		t.Skipf("needs ganesha.nfsd (hack/install-deps.sh installs nfs-ganesha nfs-ganesha-vfs): %v", err)
	}
	if _, err := os.Stat(filepath.Join(PluginsDir, "libfsalvfs.so")); err != nil {
		t.Skipf("needs ganesha's VFS FSAL (nfs-ganesha-vfs): %v", err)
	}
}

// TestRealGaneshaServesOnlyWhatItIsToldTo runs the real ganesha with the
// default minor versions (4.1 and 4.2 only) on a plain folder: the 4.1
// check answers for the export and not for another path, and the NFSv4.0
// client is refused.
func TestRealGaneshaServesOnlyWhatItIsToldTo(t *testing.T) {
	needGanesha(t)
	dir := t.TempDir()
	export := filepath.Join(dir, "export")
	if err := os.MkdirAll(export, 0o755); err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	_ = l.Close()
	ec := ExportConfig{Path: export, Pseudo: "/pv1", BindAddr: "127.0.0.1", Port: port, RecoveryRoot: filepath.Join(dir, "rec")}
	addr := ec.LocalEndpoint()
	check41 := func(ctx context.Context) error { return nfsclient.CheckExport41(ctx, addr, "/pv1", 1, "test") }
	srv := NewServer(ServerConfig{Export: ec, Dir: filepath.Join(dir, "state")}, OSExec{}, clock.RealClock{},
		Checks{Export: check41}, testr.New(t))
	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan struct{})
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx, func() { close(ready) }) }()
	select {
	case <-ready:
	case err := <-done:
		t.Fatalf("server ended before ready: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("not ready in 30s")
	}
	cctx, ccancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer ccancel()
	if err := nfsclient.CheckExport41(cctx, addr, "/pv1", 2, "test"); err != nil {
		t.Errorf("4.2 check of the export: %v", err)
	}
	var st nfsclient.ErrNFSStatus
	if err := nfsclient.CheckExport41(cctx, addr, "/other", 1, "test"); !errors.As(err, &st) {
		t.Errorf("check of a path that is not exported = %v, want an NFS status", err)
	}
	v40 := nfsclient.New(nfsclient.Endpoint{Addr: addr, Export: "/pv1"}, nfsclient.Options{}, clock.RealClock{}, testr.New(t))
	defer v40.Close()
	if err := v40.Check(cctx); err == nil {
		t.Error("an NFSv4.0 client was served by a 4.1+ export")
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run after cancel = %v", err)
	}
}
