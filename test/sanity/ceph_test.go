//go:build ceph

package sanity

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/berth-io/berth/api/v1alpha1"
	berthcsi "github.com/berth-io/berth/internal/csi"
	"github.com/berth-io/berth/internal/testenv/testceph"
)

// cephCluster is the ceph StorageCluster (and its Secret) of the ceph
// class's volumes.
const cephCluster = "sanity-ceph"

// cephNodeSpecs are the ceph class's specs that stage or publish a volume
// on the node; the rest are the controller's, or refusals of bad requests.
const cephNodeSpecs = cephSpecs + `Node Service (NodeUnpublishVolume should remove target path|` +
	`NodeGetVolumeStats should fail when volume does not exist on the specified path|` +
	`NodeExpandVolume should work if node-expand is called after node-publish|should work|should be idempotent)$`

// cephSanity brings up the sanity tests' own test Ceph (folder and ports
// apart from the other packages'), makes a ceph StorageCluster on its pool
// with the berth client's Secret, and configures the ceph class's suites
// (userspace mounter: krbd is not in this kernel). It returns the specs to
// skip: all where no test Ceph can run, the node's where this agent cannot
// stage a ceph volume yet; each skip printed with its reason.
func cephSanity(t *testing.T, configure func(params map[string]string, secretsFile string)) []string {
	// The scripts bound their own time (a cold start installs packages).
	ctx := context.Background()
	if reason := testceph.SkipReason(ctx); reason != "" {
		fmt.Printf("sanity: the ceph class's specs are skipped: %s\n", reason)
		return []string{cephSpecs}
	}
	c := testceph.New(testceph.Options{Dir: "/var/lib/berth-ceph-sanity-test", Addr: "127.0.0.1",
		MonPort: 3314, PortMin: 7300, PortMax: 7399})
	t.Cleanup(func() {
		if err := c.Stop(context.Background()); err != nil {
			t.Errorf("stop the test Ceph: %v", err)
		}
	})
	if err := c.Up(ctx); err != nil {
		t.Fatal(err)
	}
	// Runs before the stop: every image the suites made is gone.
	t.Cleanup(func() { noImageLeft(t, c) })

	if err := c.MakeStorageCluster(ctx, drv.env.Client, cephCluster, berthNamespace, drv.dataDir); err != nil {
		t.Fatal(err)
	}
	if tr := userspaceTransport(); tr != "" {
		var sc v1.StorageCluster
		if err := drv.env.Client.Get(ctx, client.ObjectKey{Name: cephCluster}, &sc); err != nil {
			t.Fatal(err)
		}
		sc.Spec.Agent.UserspaceTransport = tr
		if err := drv.env.Client.Update(ctx, &sc); err != nil {
			t.Fatal(err)
		}
	}
	params := map[string]string{v1.ParamStorageCluster: cephCluster, berthcsi.ParamMounter: string(v1.MounterUserspace)}
	// The cephx key reaches the node as NodeStageVolume secrets, as the
	// ceph classes' node-stage-secret gives them to kubelet.
	// The nodes' client: `profile rbd` alone.
	key, err := c.NodeClientKey()
	if err != nil {
		t.Fatal(err)
	}
	secrets := map[string]string{v1.CephSecretUserID: c.NodeClient, v1.CephSecretUserKey: key}
	secretsFile := filepath.Join(work, "ceph-secrets.yaml")
	if err := os.WriteFile(secretsFile, fmt.Appendf(nil, "NodeStageVolumeSecret:\n  %s: %q\n  %s: %q\n",
		v1.CephSecretUserID, c.NodeClient, v1.CephSecretUserKey, key), 0o600); err != nil {
		t.Fatal(err)
	}
	configure(params, secretsFile)
	if reason := cephNodeMissing(t, params, secrets); reason != "" {
		fmt.Printf("sanity: the ceph class's node specs (stage, publish) are skipped: %s\n", reason)
		return []string{cephNodeSpecs}
	}
	return nil
}

// cephNodeMissing stages one ceph volume on the node: "" when that works
// (the volume is unstaged and deleted again), else why this agent cannot
// serve ceph volumes yet. Only the answer of an agent without the ceph
// transport counts as missing: it looks for a local image file of the
// volume and finds none (NotFound "image of volume ...: volume not found").
// Any other failure fails the test.
func cephNodeMissing(t *testing.T, params, secrets map[string]string) string {
	cl := dial(t)
	ctx := testCtx(t)
	vol, err := cl.ctrl.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "sanity-probe", Parameters: params,
		CapacityRange: &csi.CapacityRange{RequiredBytes: 64 << 20}, VolumeCapabilities: []*csi.VolumeCapability{mountCap()}})
	if err != nil {
		t.Fatalf("CreateVolume of a ceph volume: %v", err)
	}
	id := vol.GetVolume().GetVolumeId()
	defer func() {
		if _, err := cl.ctrl.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: id}); err != nil {
			t.Errorf("DeleteVolume of the probe: %v", err)
		}
	}()
	staging, _ := kubeletDirs(t)
	_, err = cl.node.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: id, StagingTargetPath: staging,
		VolumeCapability: mountCap(), VolumeContext: vol.GetVolume().GetVolumeContext(), Secrets: secrets})
	if err == nil {
		if _, err := cl.node.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: staging}); err != nil {
			t.Fatalf("NodeUnstageVolume of the probe: %v", err)
		}
		return ""
	}
	st := status.Convert(err)
	t.Logf("NodeStageVolume of a ceph volume: %v", err)
	if st.Code() != codes.NotFound || !noLocalImage.MatchString(st.Message()) {
		t.Fatalf("NodeStageVolume of a ceph volume failed, not as a missing ceph transport: %v", err)
	}
	return fmt.Sprintf("this agent cannot stage a ceph volume yet (%s: %s)", st.Code(), st.Message())
}

// noLocalImage is the agent's answer when it finds no local image file.
var noLocalImage = regexp.MustCompile(`^image of volume .+: volume not found$`)

// noImageLeft fails t when the test Ceph's pool still holds an image.
func noImageLeft(t *testing.T, c *testceph.Cluster) {
	out, err := c.RBD(testCtx(t), "ls", c.Pool)
	if err != nil {
		t.Errorf("rbd ls: %v", err)
		return
	}
	if images := bytes.Fields(out); len(images) > 0 {
		t.Errorf("RBD images left behind in pool %s: %s", c.Pool, bytes.Join(images, []byte(" ")))
		return
	}
	fmt.Printf("sanity: no RBD image left in pool %s\n", c.Pool)
}
