package userspace

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	corev1 "k8s.io/api/core/v1"

	"github.com/berth-io/berth/internal/heal"
	"github.com/berth-io/berth/internal/keeper"
	"github.com/berth-io/berth/internal/testenv"
)

// TestServerCrash: a server that dies while the agent runs is restarted by
// the healer's periodic pass (every 2s here), and the writer sees no error.
func TestServerCrash(t *testing.T) {
	f := setup(t)
	nc := f.node(t)
	m := f.userspaceVolume(t, nc, "crash")
	w := startWriter(t, m, 99)
	ctx := context.Background()
	before := testenv.ScrapeAddr(t, f.agentMetrics)
	for i := 0; i < 3; i++ {
		time.Sleep(300 * time.Millisecond)
		vols, err := keeper.NewClient(f.keeperSock).List(ctx)
		if err != nil {
			t.Fatal(err)
		}
		i := slices.IndexFunc(vols, func(v keeper.Volume) bool { return v.Name == m.name })
		if i < 0 || vols[i].ServerPID == 0 {
			t.Fatalf("keeper lists no server for %s: %+v", m.name, vols)
		}
		dead := vols[i].ServerPID
		if err := killWait(dead); err != nil {
			t.Fatal(err)
		}
		killed := time.Now()
		// A write may finish from the page cache right after the kill:
		// the heal is done when the keeper lists the new server.
		for {
			if time.Since(killed) > 30*time.Second {
				t.Fatalf("no new server for %s within 30s of the death of %d", m.name, dead)
			}
			vols, err := keeper.NewClient(f.keeperSock).List(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if i := slices.IndexFunc(vols, func(v keeper.Volume) bool { return v.Name == m.name }); i >= 0 &&
				vols[i].ServerPID != 0 && vols[i].ServerPID != dead {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
		for w.lastOK.Load() < killed.UnixNano() {
			if time.Since(killed) > 30*time.Second {
				t.Fatalf("no write finished within 30s of the server's death (errors: %v)", w.Errors())
			}
			time.Sleep(10 * time.Millisecond)
		}
		t.Logf("server killed; writes went on after %s", time.Duration(w.lastOK.Load()-killed.UnixNano()).Round(time.Millisecond))
	}
	if err := w.Stop(30 * time.Second); err != nil {
		t.Errorf("writer: %v", err)
	}
	// The agent's metrics tell the same story: three heals, the keeper up
	// and holding the volume's connection.
	after := testenv.ScrapeAddr(t, f.agentMetrics)
	restarted := testenv.Series("berth_heal_volumes_total", "result", "restarted")
	if got := after[restarted] - before[restarted]; got != 3 {
		t.Errorf("%s moved by %v over three server deaths, want 3", restarted, got)
	}
	if after["berth_keeper_up"] != 1 || after["berth_keeper_connections"] < 1 ||
		after[testenv.Series("berth_volumes", "state", "Available", "transport", "fuse")] < 1 {
		t.Errorf("node gauges: keeper_up %v, keeper_connections %v, volumes{Available,fuse} %v", after["berth_keeper_up"],
			after["berth_keeper_connections"], after[testenv.Series("berth_volumes", "state", "Available", "transport", "fuse")])
	}
}

// TestKeeperDown: when the keeper dies, the volume's condition turns
// abnormal with a message that says what to do, and the healer of a
// restarted agent reports it as an Event on the Volume.
func TestKeeperDown(t *testing.T) {
	f := setup(t)
	nc := f.node(t)
	m := f.userspaceVolume(t, nc, "keeper-down")
	ctx := context.Background()
	stats := func() *csi.VolumeCondition {
		t.Helper()
		resp, err := nc.NodeGetVolumeStats(ctx, &csi.NodeGetVolumeStatsRequest{VolumeId: m.name, VolumePath: m.target})
		if err != nil {
			t.Fatalf("stats: %v", err)
		}
		return resp.GetVolumeCondition()
	}
	if c := stats(); c.GetAbnormal() {
		t.Fatalf("healthy volume reported abnormal: %s", c.GetMessage())
	}
	if err := f.killAll(ctx); err != nil {
		t.Fatal(err)
	}
	_ = f.keeperCmd.Process.Kill()
	<-f.keeperDone
	// Whatever the test ends with, the next tests get a keeper again.
	t.Cleanup(func() {
		select {
		case <-f.keeperDone:
			if err := f.startKeeper(); err != nil {
				t.Error(err)
			}
		default:
		}
		if f.agent == nil {
			if err := f.startAgent(); err != nil {
				t.Error(err)
			}
		}
	})
	if err := f.startAgent(); err != nil {
		t.Fatal(err)
	}
	waitCSI(t, nc)
	if c := stats(); !c.GetAbnormal() || !strings.Contains(c.GetMessage(), "keeper is not running") {
		t.Errorf("condition with the keeper dead = %+v, want abnormal, saying the keeper is not running", c)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		var evs corev1.EventList
		if err := f.env.Client.List(ctx, &evs); err != nil {
			t.Fatal(err)
		}
		i := slices.IndexFunc(evs.Items, func(e corev1.Event) bool {
			return e.InvolvedObject.Name == m.name && e.Reason == heal.ReasonKeeperDown && e.Type == corev1.EventTypeWarning
		})
		if i >= 0 {
			t.Logf("event: %s", evs.Items[i].Message)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no %s event on Volume %s", heal.ReasonKeeperDown, m.name)
		}
		time.Sleep(200 * time.Millisecond)
	}
	// A new keeper does not have the old connection: still abnormal, and
	// unstage (in cleanup) must clear the dead mounts.
	if err := f.startKeeper(); err != nil {
		t.Fatal(err)
	}
	if c := stats(); !c.GetAbnormal() {
		t.Errorf("condition after a keeper restart = %+v, want abnormal", c)
	}
	if vols, err := keeper.NewClient(f.keeperSock).List(ctx); err != nil || len(vols) != 0 {
		t.Errorf("new keeper lists %+v, %v", vols, err)
	}
}

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
