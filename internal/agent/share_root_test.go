package agent

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/go-logr/logr/testr"
	"google.golang.org/grpc/codes"
	"k8s.io/utils/exec"

	v1 "github.com/berth-io/berth/api/v1alpha1"
	"github.com/berth-io/berth/internal/agent/errcode"
	"github.com/berth-io/berth/internal/mount"
)

// TestRootPublishSharedRefusedWithoutNFS: on a node whose kernel has no NFS
// client (this machine), a workload's publish of a running share is refused
// with FailedPrecondition by the real check, through the real mounter, and
// leaves no entry, no target and no mount.
func TestRootPublishSharedRefusedWithoutNFS(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: the real mounter")
	}
	if err := mount.HostNFSClient().Check(); err == nil {
		t.Skip("this node has a kernel NFS client: the refusal cannot happen here")
	}
	e, target := newShareEnv(t, v1.ShareRunning, shareEndpoint, nil)
	e.cfg.NFS = nil // the real check
	e.cfg.Mounts = mount.NewManager(mount.NewMounter(), exec.New(), testr.New(t))
	e.agent = newTestAgent(t, e.cfg)
	err := e.publishPod(t, target)
	if errcode.Code(err) != codes.FailedPrecondition || !errors.Is(err, mount.ErrNoNFSClient) {
		t.Fatalf("publish: %v (%s), want FailedPrecondition: no NFS client", err, errcode.Code(err))
	}
	t.Logf("refused: %v", err)
	if len(e.fence.holds) != 0 {
		t.Errorf("refused publish left entries %v", e.fence.holds)
	}
	if _, err := os.Stat(filepath.Dir(target)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("refused publish made the pod dir: %v", err)
	}
	if mounted, err := e.cfg.Mounts.IsMounted(t.Context(), target); err != nil || mounted {
		t.Errorf("target mounted %t (%v)", mounted, err)
	}
}
