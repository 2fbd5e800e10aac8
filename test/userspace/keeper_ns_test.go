package userspace

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	v1 "github.com/berth-io/berth/api/v1alpha1"
	"github.com/berth-io/berth/internal/blockdev"
	"github.com/berth-io/berth/internal/keeper"
)

// TestKeeperInOtherMountNamespace: a keeper in a mount namespace of its own
// (a keeper pod without mount propagation) mounts each volume's FUSE
// connection where the agent cannot see it, which used to surface as a
// bare "losetup: .../disk.img: No such file or directory". The stage is
// refused with an error that names the keeper's socket, the paths and the
// fix, and leaves nothing behind: no mount, loop device, connection,
// server, record or hold.
func TestKeeperInOtherMountNamespace(t *testing.T) {
	f := setup(t)
	ctx := context.Background()
	sock := filepath.Join(f.dir, "keeper-private.sock")
	log, err := os.OpenFile(filepath.Join(f.dir, "keeper-private.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = log.Close() }()
	// unshare execs the keeper: the pid is the keeper's, and its namespace
	// (with any mount in it) goes with it.
	cmd := exec.Command("unshare", "--mount", "--propagation", "private", f.berth, "keeper", "--socket", sock)
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	kc := keeper.NewClient(sock)
	for deadline := time.Now().Add(10 * time.Second); kc.Ping(ctx) != nil; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the keeper in its own mount namespace did not answer within 10s")
		}
	}
	f.stopAgent()
	t.Cleanup(func() {
		f.stopAgent()
		if err := f.startAgent(); err != nil {
			t.Error(err)
		}
	})
	if err := f.startAgent("--keeper-socket", sock); err != nil {
		t.Fatal(err)
	}
	nc := f.node(t)

	const name = "keeper-ns"
	vol := f.newVolume(t, name, "ext4", "64Mi", v1.MounterUserspace)
	m := f.paths(t, name)
	err = retryBusy(func() error {
		_, err := nc.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: name, StagingTargetPath: m.staging, VolumeCapability: mountCap()})
		return err
	})
	if err == nil {
		t.Cleanup(func() { f.unstage(t, nc, m) })
		t.Fatal("staged with the keeper's mount out of the agent's sight")
	}
	t.Logf("refused: %v", err)
	mp := filepath.Join(f.dir, "run", "blockdev", name)
	if status.Code(err) != codes.FailedPrecondition {
		t.Errorf("code %s, want FailedPrecondition", status.Code(err))
	}
	for _, want := range []string{sock, mp, filepath.Join(mp, blockdev.FileName), "mount namespace", "--run-dir", "mountPropagation"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("the refusal does not name %q", want)
		}
	}
	f.leftNothing(t, name, vol.Status.Path)
	held, err := kc.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if slices.ContainsFunc(held, func(v keeper.Volume) bool { return v.Name == name }) {
		t.Errorf("the keeper in its own namespace still holds %s: %+v", name, held)
	}
	if _, err := os.Lstat(mp); !os.IsNotExist(err) {
		t.Errorf("mountpoint %s left: %v", mp, err)
	}
}
