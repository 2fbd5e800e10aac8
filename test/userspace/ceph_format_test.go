//go:build ceph

package userspace

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/berth-io/berth/api/v1alpha1"
	"github.com/berth-io/berth/internal/testenv/testceph"
)

// imageMeta is the format record in an RBD image's metadata, "" if none.
func imageMeta(ctx context.Context, t *testing.T, c *testceph.Cluster, spec string) string {
	t.Helper()
	out, err := c.RBD(ctx, "image-meta", "list", spec)
	if err != nil {
		t.Fatalf("rbd image-meta list %s: %v: %s", spec, err, out)
	}
	for _, l := range strings.Split(string(out), "\n") {
		if k, v, ok := strings.Cut(strings.TrimSpace(l), " "); ok && k == "berth.formatted" {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

// headZero says whether the first MiB of an RBD image reads as zeros.
func headZero(ctx context.Context, t *testing.T, c *testceph.Cluster, spec string) bool {
	t.Helper()
	out := filepath.Join(t.TempDir(), "image")
	if b, err := c.RBD(ctx, "export", "--no-progress", spec, out); err != nil {
		t.Fatalf("rbd export %s: %v: %s", spec, err, b)
	}
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range b[:1<<20] {
		if c != 0 {
			return false
		}
	}
	return true
}

// wantRefused fails unless a stage of m was refused because the image
// records a filesystem, and left nothing behind.
func (f *fixture) wantRefused(t *testing.T, err error, m mounted) {
	t.Helper()
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "refusing to format") ||
		!strings.Contains(err.Error(), "its image records a ext4 filesystem") {
		t.Fatalf("stage of %s: %v; want FailedPrecondition: refusing to format, its image records a ext4 filesystem", m.name, err)
	}
	t.Logf("stage of %s refused: %v", m.name, err)
	f.cephLeftNothing(t, m.name)
}

// A ceph volume's format record lives in its RBD image's metadata: the
// first stage makes ext4 and records it there (not in the Volume's status,
// which the admission policy keeps to node-bound Volumes). Once the
// filesystem's superblock is gone (the first MiB zeroed through the
// device), blkid finds nothing and the device's ends read as zeros, yet a
// new stage refuses to format instead of making a new filesystem over the
// data. A clone of the volume carries the record and is refused too.
func TestCephFormatRecordOnRealCeph(t *testing.T) {
	f, c, nc := cephSetup(t)
	ctx := t.Context()
	const name = "ceph-fmt"
	vol, m, secrets := f.userspaceCephVolume(ctx, t, c, name, 64)
	if rec := imageMeta(ctx, t, c, vol.Status.Path); rec != "" {
		t.Fatalf("new image has a format record %q", rec)
	}
	if err := stageCeph(nc, m, "ext4", secrets); err != nil {
		t.Fatalf("stage: %v", err)
	}
	staged := true
	t.Cleanup(func() {
		if staged {
			f.unstage(t, nc, m)
		}
	})
	rec := imageMeta(ctx, t, c, vol.Status.Path)
	if !strings.Contains(rec, `"fsType":"ext4"`) {
		t.Fatalf("format record on %s: %q, want ext4", vol.Status.Path, rec)
	}
	t.Logf("format record of %s: %s", vol.Status.Path, rec)
	if err := f.env.Client.Get(ctx, client.ObjectKeyFromObject(vol), vol); err != nil {
		t.Fatal(err)
	}
	if vol.Status.Formatted != nil {
		t.Errorf("the Volume of a ceph volume has status.formatted %+v: the agent writes no node-less Volume", vol.Status.Formatted)
	}
	if err := os.WriteFile(filepath.Join(m.staging, "data"), []byte(strings.Repeat("data", 1<<18)), 0o600); err != nil {
		t.Fatal(err)
	}

	// Damage: the filesystem unmounted (so that ext4 writes no superblock
	// back), its first MiB zeroed through the device, then unstaged.
	dev := stagedDevice(t, m.staging)
	if err := unix.Unmount(m.staging, 0); err != nil {
		t.Fatal(err)
	}
	fh, err := os.OpenFile(dev, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := fh.WriteAt(make([]byte, 1<<20), 0); err != nil {
		t.Fatal(err)
	}
	if err := fh.Sync(); err != nil {
		t.Fatal(err)
	}
	_ = fh.Close()
	f.unstage(t, nc, m)
	staged = false
	if !headZero(ctx, t, c, vol.Status.Path) {
		t.Fatal("the image's first MiB is not zero after the wipe")
	}

	f.wantRefused(t, stageCeph(nc, m, "ext4", secrets), m)
	if !headZero(ctx, t, c, vol.Status.Path) {
		t.Fatal("the refused stage wrote to the image")
	}

	// A clone, made as the CSI controller makes one (snapshot, clone,
	// flatten), and its Volume.
	clone := name + "-clone"
	snap := vol.Status.Path + "@tmp"
	cloneSpec := c.Pool + "/berth-" + clone
	for _, args := range [][]string{
		{"snap", "create", snap}, {"snap", "protect", snap},
		{"clone", "--image-feature", "layering,exclusive-lock", snap, cloneSpec},
		{"flatten", "--no-progress", cloneSpec}, {"snap", "unprotect", snap}, {"snap", "rm", "--no-progress", snap},
	} {
		if out, err := c.RBD(ctx, args...); err != nil {
			t.Fatalf("rbd %v: %v: %s", args, err, out)
		}
	}
	t.Cleanup(func() { _, _ = c.RBD(context.Background(), "rm", "--no-progress", cloneSpec) })
	if got := imageMeta(ctx, t, c, cloneSpec); got != rec {
		t.Fatalf("format record of the clone %q, want its source's %q", got, rec)
	}
	cv := &v1.Volume{ObjectMeta: metav1.ObjectMeta{Name: clone}, Spec: v1.VolumeSpec{StorageCluster: name,
		Size: resource.MustParse("64Mi"), AccessMode: v1.ReadWriteOnce, FSType: "ext4", Mounter: v1.MounterUserspace,
		Source: &v1.VolumeSource{Volume: name}}}
	if err := f.env.Client.Create(ctx, cv); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = f.env.Client.Delete(context.Background(), cv) })
	capacity := resource.MustParse("64Mi")
	cv.Status = v1.VolumeStatus{State: v1.VolumeAvailable, Path: cloneSpec, Capacity: &capacity}
	if err := f.env.Client.Status().Update(ctx, cv); err != nil {
		t.Fatal(err)
	}
	cm := f.paths(t, clone)
	f.wantRefused(t, stageCeph(nc, cm, "ext4", secrets), cm)
	if !headZero(ctx, t, c, cloneSpec) {
		t.Fatal("the refused stage wrote to the clone")
	}
}
