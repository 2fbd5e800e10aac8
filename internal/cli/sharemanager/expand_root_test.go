package sharemanager_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"k8s.io/utils/clock"

	"github.com/berth-io/berth/internal/share/nfsclient"
)

// TestExpansionGrowsTheServedFilesystem: a real share manager serves a
// real ext4 or xfs on a loop device through a real ganesha; the image
// grows and its loop device is refreshed (the backend's and the agent's
// parts of an expansion), and an NFS client then sees the larger
// filesystem, the file written before reads back intact, a client that
// writes files all along goes on and loses none, and a file written after
// is stored. xfs grows online under the running ganesha;
// ext4 too where this process may (CAP_SYS_RESOURCE), else the share
// manager stages it again (grown unmounted) under a new ganesha, which
// the client rides as a restart. The share manager itself never exits.
func TestExpansionGrowsTheServedFilesystem(t *testing.T) {
	for _, fsType := range []string{"ext4", "xfs"} {
		t.Run(fsType, func(t *testing.T) { testExpansion(t, fsType) })
	}
}

func testExpansion(t *testing.T, fsType string) {
	if _, err := exec.LookPath("mkfs." + fsType); err != nil {
		t.Skipf("needs mkfs.%s: %v", fsType, err)
	}
	e := newShareEnv(t)
	sm := e.start(t, "--fs-type", fsType)
	ep := e.endpoint()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const machine = "expand-test"
	before, err := nfsclient.Statfs41(ctx, ep, 1, machine)
	if err != nil {
		t.Fatalf("statfs over NFS: %v\n%s", err, e.log())
	}
	data := make([]byte, 3<<20+5)
	_, _ = rand.Read(data)
	if _, err := nfsclient.WriteCommitRead41(ctx, ep, "before.bin", data, 1, machine); err != nil {
		t.Fatalf("write before the expansion: %v", err)
	}
	gpid := e.ganeshaPid(t)
	// A client keeps writing files across the growth.
	client := &v41Client{ep: ep}
	wctx, stopWrites := context.WithCancel(ctx)
	w := &writer{}
	var wg sync.WaitGroup
	wg.Go(func() { w.run(wctx, client) })
	defer func() { stopWrites(); wg.Wait() }()
	if _, err := w.firstAckOver(0, 30*time.Second); err != nil {
		t.Fatalf("no write before the expansion: %v", err)
	}

	if err := os.Truncate(filepath.Join(e.dir, "volume.img"), 1<<30); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("losetup", "-c", e.dev).CombinedOutput(); err != nil {
		t.Fatalf("losetup -c: %v: %s", err, out)
	}
	grownAt := time.Now()
	var after nfsclient.Space
	for {
		after, err = nfsclient.Statfs41(ctx, ep, 1, machine)
		if err == nil && after.Total > before.Total+400<<20 {
			break
		}
		if sm.Exited() || ctx.Err() != nil || time.Since(grownAt) > time.Minute {
			t.Fatalf("the client still sees %+v (before %+v, last error %v); exited %v; log:\n%s", after, before, err, sm.Exited(), e.log())
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("%s: the client sees %d bytes (was %d) %s after the device grew", fsType, after.Total, before.Total, time.Since(grownAt).Round(time.Millisecond))
	// The client can see the new size a moment before the share manager's
	// log line about it reaches e.log(): wait for the outcome, bounded.
	var online, restarted bool
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		online = strings.Contains(e.log(), "grew the served filesystem online")
		restarted = e.ganeshaPid(t) != gpid
		if online || restarted || time.Now().After(deadline) {
			break
		}
	}
	if restarted == online {
		t.Errorf("grown online: %v, ganesha restarted: %v; one of the two", online, restarted)
	}
	t.Logf("%s: grown online %v, ganesha restarted %v", fsType, online, restarted)
	if fsType == "xfs" && !online {
		t.Errorf("xfs did not grow online:\n%s", e.log())
	}

	conns := client.Connects()
	if _, err := w.firstAckOver(conns, 30*time.Second); err != nil {
		t.Fatalf("the writer did not go on after the growth: %v\n%s", err, e.log())
	}
	stopWrites()
	wg.Wait()
	acks := w.snapshot()
	for _, a := range acks {
		var b []byte
		if err := nfsclient.Retry41(ctx, clock.RealClock{}, 0, func(ctx context.Context) error {
			b, err = nfsclient.ReadFile41(ctx, ep, a.name, 1, machine)
			return err
		}); err != nil || sha256.Sum256(b) != a.sum {
			t.Fatalf("acknowledged %s does not read back (%v)", a.name, err)
		}
	}
	t.Logf("%s: %d files written across the growth read back", fsType, len(acks))

	var got []byte
	if err := nfsclient.Retry41(ctx, clock.RealClock{}, 0, func(ctx context.Context) error {
		got, err = nfsclient.ReadFile41(ctx, ep, "before.bin", 1, machine)
		return err
	}); err != nil {
		t.Fatalf("read back after the expansion: %v", err)
	}
	if !bytes.Equal(got, data) {
		t.Fatalf("before.bin reads back %d bytes that differ from the %d written", len(got), len(data))
	}
	more := make([]byte, 5<<20)
	_, _ = rand.Read(more)
	if err := nfsclient.Retry41(ctx, clock.RealClock{}, 0, func(ctx context.Context) error {
		got, err = nfsclient.WriteCommitRead41(ctx, ep, "after.bin", more, 1, machine)
		return err
	}); err != nil || !bytes.Equal(got, more) {
		t.Fatalf("write after the expansion: %v (equal %v)", err, bytes.Equal(got, more))
	}
	if sm.Exited() {
		t.Fatalf("the share manager exited:\n%s", e.log())
	}
	t.Logf("%s: old file read back and new file written %s after the device grew", fsType, time.Since(grownAt).Round(time.Millisecond))

	sm.Stop(syscall.SIGTERM, 20*time.Second)
	if code := sm.ExitCode(); code != 0 {
		t.Errorf("share manager exited %d on SIGTERM:\n%s", code, e.log())
	}
	check := []string{"fsck.ext4", "-n", "-f", e.dev}
	if fsType == "xfs" {
		check = []string{"xfs_repair", "-n", e.dev}
	}
	if out, err := exec.Command(check[0], check[1:]...).CombinedOutput(); err != nil {
		t.Errorf("%s after the expansion: %v\n%s", check[0], err, out)
	}
}
