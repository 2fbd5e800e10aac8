//go:build !ceph

package csi

import (
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/berth-io/berth/api/v1alpha1"
)

// Built without the ceph tag, berth refuses a ceph class's volumes and
// capacity with FailedPrecondition naming the build tag, and records nothing.
func TestCephClassRefusedWithoutCephBuild(t *testing.T) {
	ctx := apiCtx(t, time.Minute)
	secret := cephSecret(ctx, t, "ceph-stub", "berth", "AQBfake==")
	sc := cephCluster(secret.Name, "127.0.0.1:3300", "rbd")
	create(ctx, t, sc)

	s := apiController(t, ControllerConfig{})
	defer s.Close()
	params := map[string]string{v1.ParamStorageCluster: sc.Name}
	const says = "berth built without the ceph backend (build tag ceph)"
	_, err := s.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "ceph-stub", Parameters: params,
		VolumeCapabilities: []*csi.VolumeCapability{capability(csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER, false, "")}})
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), says) {
		t.Errorf("CreateVolume: %v, want FailedPrecondition saying %q", err, says)
	}
	if err := env.Client.Get(ctx, client.ObjectKey{Name: "ceph-stub"}, &v1.Volume{}); !apierrors.IsNotFound(err) {
		t.Errorf("a refused create made a Volume (%v)", err)
	}
	if _, err := s.GetCapacity(ctx, &csi.GetCapacityRequest{Parameters: params}); status.Code(err) != codes.FailedPrecondition {
		t.Errorf("GetCapacity: %v, want FailedPrecondition", err)
	}
}
