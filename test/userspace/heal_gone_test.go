package userspace

import (
	"context"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/berth-io/berth/api/v1alpha1"
	"github.com/berth-io/berth/internal/keeper"
	"github.com/berth-io/berth/internal/testenv"
)

// TestHealSkipsDeletedVolume: while the agent and every blockdev server
// are dead, one staged userspace volume's Volume object (past its
// finalizer) and image are really deleted. The restarted agent's healer
// skips that volume and logs why, once over several passes; it starts no
// server for it, the agent keeps running, and the other volume is healed:
// its verifying writer goes on without an error.
func TestHealSkipsDeletedVolume(t *testing.T) {
	f := setup(t)
	nc := f.node(t)
	ctx := context.Background()
	kept := f.userspaceVolume(t, nc, "heal-kept")
	gone := f.userspaceVolume(t, nc, "heal-gone")
	// Nothing will ever serve the gone volume again: its connection is
	// closed so that its unstage (at cleanup) gets I/O errors, not a hang.
	t.Cleanup(func() { _ = keeper.NewClient(f.keeperSock).Close(ctx, gone.name) })
	w := startWriter(t, kept, 7)
	f.crash(t)
	vol := &v1.Volume{}
	if err := f.env.Client.Get(ctx, client.ObjectKey{Name: gone.name}, vol); err != nil {
		t.Fatal(err)
	}
	image := vol.Status.Path
	if err := f.env.Client.Delete(ctx, vol); err != nil {
		t.Fatal(err)
	}
	// The agent's finalizer would wait for the unstage: deleted by hand.
	if err := f.env.Client.Patch(ctx, vol, client.RawPatch(types.MergePatchType, []byte(`{"metadata":{"finalizers":null}}`))); err != nil &&
		!apierrors.IsNotFound(err) {
		t.Fatal(err)
	}
	if err := f.env.Client.Get(ctx, client.ObjectKey{Name: gone.name}, vol); !apierrors.IsNotFound(err) {
		t.Fatalf("Volume %s still there: %v", gone.name, err)
	}
	if err := os.Remove(image); err != nil {
		t.Fatal(err)
	}

	restarted := time.Now()
	if err := f.startAgent(); err != nil {
		t.Fatal(err)
	}
	waitCSI(t, nc)
	w.waitWrite(t, restarted, 60*time.Second) // the kept volume is healed
	// Several heal passes (one every 2s here) after the first.
	time.Sleep(5 * time.Second)
	select {
	case <-f.agentDone:
		t.Fatal("the agent exited while healing")
	default:
	}
	if err := w.Stop(30 * time.Second); err != nil {
		t.Errorf("the kept volume's writer: %v", err)
	}
	vols, err := keeper.NewClient(f.keeperSock).List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if i := slices.IndexFunc(vols, func(v keeper.Volume) bool { return v.Name == gone.name }); i < 0 || vols[i].ServerPID != 0 {
		t.Errorf("keeper's record of the deleted volume: %+v; want its connection held with no server", vols)
	}
	log, err := os.ReadFile(f.agentLog)
	if err != nil {
		t.Fatal(err)
	}
	var said int
	for _, l := range strings.Split(string(log), "\n") {
		if strings.Contains(l, "heal skipped") && strings.Contains(l, gone.name) {
			said++
		}
	}
	if said != 1 {
		t.Errorf("the agent log says %d times that healing %s was skipped, want once", said, gone.name)
	}
	// The restarted agent's counters start at zero.
	skipped := testenv.Series("berth_heal_volumes_total", "result", "skipped")
	if n := testenv.ScrapeAddr(t, f.agentMetrics)[skipped]; n < 2 {
		t.Errorf("%s = %v after several passes, want the deleted volume counted in each", skipped, n)
	}
}
