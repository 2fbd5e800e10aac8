package userspace

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/berth-io/berth/api/v1alpha1"
	"github.com/berth-io/berth/internal/nbd"
)

// withNBDAgent restarts the agent set to serve new userspace volumes over
// nbd; cleanup brings back the default agent for the other tests.
func (f *fixture) withNBDAgent(t *testing.T) csi.NodeClient {
	t.Helper()
	f.stopAgent()
	if err := f.startAgent("--userspace-transport", "nbd", "--nbd-dead-conn-timeout", "60s"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		f.stopAgent()
		if err := f.startAgent(); err != nil {
			t.Errorf("restart the default agent: %v", err)
		}
	})
	nc := f.node(t)
	return nc
}

// TestNBDTransport: an agent set to the nbd transport on a kernel without
// nbd refuses to stage a userspace volume, says why and what to do, and
// leaves nothing behind; on a kernel with nbd the volume is served over
// /dev/nbdN and survives the agent and its server being killed.
func TestNBDTransport(t *testing.T) {
	f := setup(t)
	ok, reason := nbd.Available("/sys")
	if ok {
		t.Run("refused without nbd", func(t *testing.T) { t.Skip("this kernel has nbd") })
		t.Run("heals over nbd", func(t *testing.T) { f.nbdHeals(t) })
		return
	}
	t.Run("refused without nbd", func(t *testing.T) { f.nbdRefused(t, reason) })
	t.Run("heals over nbd", func(t *testing.T) {
		t.Skipf("the real nbd path needs the kernel's nbd driver: %s", reason)
	})
}

func (f *fixture) nbdRefused(t *testing.T, reason string) {
	nc := f.withNBDAgent(t)
	ctx := context.Background()
	name := "nbd-refused"
	vol := volumeObject(name, "ext4", "64Mi", v1.MounterUserspace)
	if err := f.env.Client.Create(ctx, vol); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = f.env.Client.Delete(ctx, vol) })
	f.env.WaitVolumeAvailable(t, vol)
	staging := f.stagingPath(name)
	if err := os.MkdirAll(staging, 0o750); err != nil {
		t.Fatal(err)
	}
	for range 2 { // a retry is refused the same way
		err := retryBusy(func() error {
			_, err := nc.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: name, StagingTargetPath: staging, VolumeCapability: mountCap()})
			return err
		})
		if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "modprobe nbd") ||
			!strings.Contains(err.Error(), "transport to fuse") {
			t.Fatalf("stage over nbd without nbd: %v; want FailedPrecondition naming modprobe nbd and the fuse transport (%s)", err, reason)
		}
		t.Logf("refused: %v", err)
	}
	// Nothing made: no server record, no mount, no hold on the volume.
	for _, pattern := range []string{name + "*", filepath.Join("_volumes", name+".json")} {
		if m, _ := filepath.Glob(filepath.Join(f.dir, "run", "blockdev", pattern)); len(m) != 0 {
			t.Errorf("records left: %v", m)
		}
	}
	if points, _ := mountsUnder(staging); len(points) != 0 {
		t.Errorf("mounts left: %v", points)
	}
	att := &v1.Attachment{}
	err := f.env.Client.Get(ctx, client.ObjectKey{Name: name}, att)
	if err == nil && len(att.Spec.Attachments) != 0 {
		t.Errorf("attachment holds %+v after a refused stage", att.Spec.Attachments)
	} else if err != nil && !apierrors.IsNotFound(err) {
		t.Fatal(err)
	}
}

// nbdHeals runs only where the kernel has nbd: a writer on a volume
// served over nbd sees no error while the agent and the server are killed
// and the agent's healer reconnects a new server.
func (f *fixture) nbdHeals(t *testing.T) {
	nc := f.withNBDAgent(t)
	m := f.userspaceVolume(t, nc, "nbd-heal")
	if dev := mountSource(m.staging); !strings.HasPrefix(dev, "/dev/nbd") {
		t.Fatalf("staged on %q, want an nbd device", dev)
	}
	w := startWriter(t, m, 7)
	for range 3 {
		time.Sleep(500 * time.Millisecond)
		b, err := os.ReadFile(filepath.Join(f.dir, "run", "blockdev", "_volumes", m.name+".json"))
		if err != nil {
			t.Fatal(err)
		}
		var rec struct {
			Transport string `json:"transport"`
			ServerPID int    `json:"serverPID"`
		}
		if err := json.Unmarshal(b, &rec); err != nil || rec.Transport != "nbd" || rec.ServerPID == 0 {
			t.Fatalf("volume record %q: %v; want transport nbd with the server's pid", b, err)
		}
		pid := rec.ServerPID
		f.killAgent()
		if err := killWait(pid); err != nil {
			t.Fatal(err)
		}
		killed := time.Now()
		if err := f.startAgent("--userspace-transport", "nbd", "--nbd-dead-conn-timeout", "60s"); err != nil {
			t.Fatal(err)
		}
		w.waitWrite(t, killed, 30*time.Second)
	}
	if err := w.Stop(30 * time.Second); err != nil {
		t.Errorf("writer: %v", err)
	}
}
