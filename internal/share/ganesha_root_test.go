package share_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	"golang.org/x/sys/unix"
	"k8s.io/utils/clock"

	"github.com/berth-io/berth/internal/share/nfsclient"
	"github.com/berth-io/berth/internal/share/sharetest"
)

// TestRealGaneshaServesOnlyWhatItIsToldTo runs the real ganesha with the
// default minor versions (4.1 and 4.2 only): the export answers a 4.1 and
// a 4.2 session and another path does not; a file written unstable and
// COMMITted reads back and is in the exported folder; the NFSv4.0 client
// is refused.
func TestRealGaneshaServesOnlyWhatItIsToldTo(t *testing.T) {
	g := sharetest.Start(t, 1, 2)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	addr := g.Endpoint.Addr
	if err := nfsclient.CheckExport41(ctx, addr, "/pv1", 2, "test"); err != nil {
		t.Errorf("4.2 check of the export: %v", err)
	}
	var st nfsclient.ErrNFSStatus
	if err := nfsclient.CheckExport41(ctx, addr, "/other", 1, "test"); !errors.As(err, &st) {
		t.Errorf("check of a path that is not exported = %v, want an NFS status", err)
	}
	// The export's size over NFS is its folder's filesystem's (statfs).
	if sp, err := nfsclient.Statfs41(ctx, g.Endpoint, 1, "test"); err != nil {
		t.Errorf("statfs over NFS: %v", err)
	} else {
		var st unix.Statfs_t
		if err := unix.Statfs(g.Dir, &st); err != nil {
			t.Fatal(err)
		}
		if want := st.Blocks * uint64(st.Bsize); sp.Total != want || sp.Avail > sp.Total {
			t.Errorf("statfs over NFS %+v, want total %d (statfs of %s)", sp, want, g.Dir)
		}
	}
	data := make([]byte, 700<<10+3)
	_, _ = rand.Read(data)
	got, err := nfsclient.WriteCommitRead41(ctx, g.Endpoint, "probe.bin", data, 1, "test")
	if err != nil {
		t.Fatalf("write, commit, read: %v", err)
	}
	if !bytes.Equal(got, data) {
		t.Fatalf("read back %d bytes that differ from the %d written", len(got), len(data))
	}
	if onDisk, err := os.ReadFile(filepath.Join(g.Dir, "probe.bin")); err != nil || !bytes.Equal(onDisk, data) {
		t.Fatalf("exported folder holds %d bytes (%v), not what was written", len(onDisk), err)
	}
	if err := nfsclient.Remove41(ctx, g.Endpoint, "probe.bin", 1, "test"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(g.Dir, "probe.bin")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("probe.bin after remove: %v", err)
	}
	v40 := nfsclient.New(g.Endpoint, nfsclient.Options{}, clock.RealClock{}, testr.New(t))
	defer v40.Close()
	if err := v40.Check(ctx); err == nil {
		t.Error("an NFSv4.0 client was served by a 4.1+ export")
	}
}
