package userspace

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/berth-io/berth/internal/keeper"
)

// TestUpgradeFromMarkers: a volume staged by an agent from before volume
// records (its only record the server log, the FUSE marker of that time)
// is found, healed and unstaged by this agent: while the agent and the
// server are dead, the volume's record is put back in the old layout; the
// restarted agent's healer must start a server under the running writer,
// and the unstage must leave nothing behind.
func TestUpgradeFromMarkers(t *testing.T) {
	f := setup(t)
	nc := f.node(t)
	m := f.userspaceVolume(t, nc, "old-layout")
	w := startWriter(t, m, 11)
	f.crash(t)
	root := filepath.Join(f.dir, "run", "blockdev")
	if err := os.Remove(filepath.Join(root, "_volumes", m.name+".json")); err != nil {
		t.Fatalf("this agent's record of %s: %v", m.name, err)
	}
	if _, err := os.Stat(filepath.Join(root, m.name+".log")); err != nil {
		t.Fatalf("the server log, the old layout's FUSE marker: %v", err)
	}
	restarted := time.Now()
	if err := f.startAgent(); err != nil {
		t.Fatal(err)
	}
	waitCSI(t, nc)
	w.waitWrite(t, restarted, 60*time.Second) // healed through the old record
	if err := w.Stop(30 * time.Second); err != nil {
		t.Errorf("writer: %v", err)
	}
	f.unstage(t, nc, m)
	if left := leftovers(t, f, keeper.NewClient(f.keeperSock), m.name, m.staging); len(left) != 0 {
		t.Errorf("left after unstaging the volume of the old layout: %v", left)
	}
}
