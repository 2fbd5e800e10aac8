// Package blockdevtest gives tests a real image file and a blockdev server
// run in the test's own process on a real FUSE connection (root).
package blockdevtest

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/go-logr/logr/testr"
	"golang.org/x/sys/unix"

	"github.com/berth-io/berth/internal/blockdev"
	"github.com/berth-io/berth/internal/blockdev/backing"
	"github.com/berth-io/berth/internal/blockdev/imagefile"
	"github.com/berth-io/berth/internal/keeper"
)

// ImageFile makes a sparse image file of size bytes (disk.img in a folder
// of the test's), opens it, and closes it when the test ends.
func ImageFile(t testing.TB, size int64, direct bool) (*imagefile.Image, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "disk.img")
	if err := os.WriteFile(path, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(path, size); err != nil {
		t.Fatal(err)
	}
	img, err := imagefile.Open(path, direct)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = img.Close() })
	return img, path
}

// Served is a server on a FUSE connection mounted at Mountpoint.
type Served struct {
	Mountpoint string
	Server     *blockdev.Server
	// FD is the connection's /dev/fuse descriptor: the caller closes it
	// once Done said the server ended.
	FD int
	// Done gets Serve's result.
	Done <-chan error
	// Stop ends Serve (its context).
	Stop context.CancelFunc
}

// Serve mounts a new FUSE connection at a folder of the test's and serves
// img on it with workers request workers. How the connection ends (an
// unmount, an abort) is the caller's: the tests differ in that.
func Serve(t testing.TB, img backing.Image, workers int) *Served {
	t.Helper()
	return ServeWith(t, blockdev.Config{Image: img, Workers: workers})
}

// ServeWith is Serve with more of the server's Config (Dev and Log are
// the test's).
func ServeWith(t testing.TB, cfg blockdev.Config) *Served {
	t.Helper()
	k := keeper.HostKernel{}
	fd, err := k.OpenFUSE()
	if err != nil {
		t.Fatal(err)
	}
	mp := filepath.Join(t.TempDir(), "mnt")
	if err := k.MountFUSE(fd, "berth-test", mp); err != nil {
		_ = unix.Close(fd)
		t.Fatal(err)
	}
	cfg.Dev, cfg.Log = fd, testr.NewWithInterface(t, testr.Options{})
	srv, err := blockdev.NewServer(cfg)
	if err != nil {
		_ = k.Unmount(mp)
		_ = unix.Close(fd)
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx) }()
	return &Served{Mountpoint: mp, Server: srv, FD: fd, Done: done, Stop: stop}
}
