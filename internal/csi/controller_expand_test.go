package csi

import (
	"context"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/go-logr/logr/testr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	v1 "github.com/berth-io/berth/api/v1alpha1"
	"github.com/berth-io/berth/internal/backend"
)

// TestExpandRetriesWhenTheVolumeChanged: the agent writes a Volume's
// status while ControllerExpandVolume raises its size (seen on a slow VM
// node: csi-sanity got Aborted). The controller reads the Volume again
// and retries; the call succeeds.
func TestExpandRetriesWhenTheVolumeChanged(t *testing.T) {
	ctx := apiCtx(t, 2*time.Minute)
	const node = "expand-conflict-node"
	storageCluster(ctx, t, "c")
	images, err := backend.NewLocal(t.TempDir(), testr.New(t))
	if err != nil {
		t.Fatal(err)
	}
	runNodeReconcilers(t, node, images)
	direct, err := client.NewWithWatch(env.Config, client.Options{Scheme: env.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	changed := 0
	// Before the controller's first spec update, another writer changes
	// the Volume: the update then conflicts, as it did on the VM node.
	c := interceptor.NewClient(direct, interceptor.Funcs{
		Update: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.UpdateOption) error {
			if vol, ok := obj.(*v1.Volume); ok && changed == 0 {
				changed++
				other := &v1.Volume{}
				if err := c.Get(ctx, client.ObjectKeyFromObject(vol), other); err != nil {
					return err
				}
				if other.Annotations == nil {
					other.Annotations = map[string]string{}
				}
				other.Annotations["test.berth.io/touched"] = "1"
				if err := c.Update(ctx, other); err != nil {
					return err
				}
			}
			return c.Update(ctx, obj, opts...)
		},
	})
	block := capability(csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER, true, "")
	s := NewController(c, ControllerConfig{Namespace: "default", Wait: 30 * time.Second}, testr.New(t))
	on := &csi.TopologyRequirement{Preferred: []*csi.Topology{{Segments: map[string]string{v1.TopologyNodeKey: node}}}}
	resp, err := s.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "expand-conflict", Parameters: map[string]string{v1.ParamStorageCluster: "c"},
		AccessibilityRequirements: on, CapacityRange: &csi.CapacityRange{RequiredBytes: 16 << 20},
		VolumeCapabilities: []*csi.VolumeCapability{block}})
	if err != nil {
		t.Fatal(err)
	}
	id := resp.GetVolume().GetVolumeId()
	t.Cleanup(func() { _, _ = s.DeleteVolume(context.Background(), &csi.DeleteVolumeRequest{VolumeId: id}) })

	grown, err := s.ControllerExpandVolume(ctx, &csi.ControllerExpandVolumeRequest{VolumeId: id,
		CapacityRange: &csi.CapacityRange{RequiredBytes: 32 << 20}, VolumeCapability: block})
	if err != nil || grown.GetCapacityBytes() != 32<<20 {
		t.Fatalf("expand after a conflicting write: %v, %v; want 32 MiB", grown, err)
	}
	if changed != 1 {
		t.Fatalf("the conflicting write ran %d times, want 1", changed)
	}
	vol := &v1.Volume{}
	if err := env.Client.Get(ctx, client.ObjectKey{Name: id}, vol); err != nil {
		t.Fatal(err)
	}
	if vol.Spec.Size.Value() != 32<<20 || vol.Annotations["test.berth.io/touched"] != "1" {
		t.Errorf("Volume after expand: size %s, annotations %v; want 32Mi and the other writer's annotation kept", &vol.Spec.Size, vol.Annotations)
	}
}
