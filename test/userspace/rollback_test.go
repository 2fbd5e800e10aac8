package userspace

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/berth-io/berth/api/v1alpha1"
	"github.com/berth-io/berth/internal/keeper"
)

// TestStageRollbackLeavesNothing: a stage through the real agent whose mkfs
// really fails (mkfs.xfs refuses a device under 300 MB) or whose mount
// really fails (ext4 refuses an unknown mount option, after a real mkfs)
// leaves, for the kernel mounter (loop on the image) and the userspace one
// (blockdev server, FUSE, loop): no mount, no loop device, no FUSE
// connection in the keeper, no blockdev server process, no Attachment
// entry. After the failed mount, the volume stages with good options.
func TestStageRollbackLeavesNothing(t *testing.T) {
	f := setup(t)
	nc := f.node(t)
	for _, mounter := range []v1.Mounter{v1.MounterKernel, v1.MounterUserspace} {
		for _, tc := range []struct {
			failing, fsType string
			flags           []string
		}{
			{"mkfs", "xfs", nil},
			{"mount", "ext4", []string{"berth-no-such-option"}},
		} {
			t.Run(string(mounter)+"/"+tc.failing, func(t *testing.T) {
				name := "rollback-" + string(mounter) + "-" + tc.failing
				vol := f.newVolume(t, name, tc.fsType, "64Mi", mounter)
				m := f.paths(t, name)
				capability := mountCapFS(tc.fsType)
				capability.GetMount().MountFlags = tc.flags
				_, err := nc.NodeStageVolume(context.Background(), &csi.NodeStageVolumeRequest{
					VolumeId: name, StagingTargetPath: m.staging, VolumeCapability: capability})
				if err == nil {
					f.unstage(t, nc, m)
					t.Fatalf("stage succeeded; want the %s to fail", tc.failing)
				}
				t.Logf("stage failed as it should: %v", err)
				f.leftNothing(t, name, vol.Status.Path)
				if tc.failing != "mount" {
					return
				}
				if _, err := nc.NodeStageVolume(context.Background(), &csi.NodeStageVolumeRequest{
					VolumeId: name, StagingTargetPath: m.staging, VolumeCapability: mountCapFS(tc.fsType)}); err != nil {
					t.Fatalf("stage with good options after the failed one: %v", err)
				}
				// What a stage makes, the check above sees.
				if made := f.leftovers(t, name, vol.Status.Path); len(made) < 3 {
					t.Errorf("a good stage made only %q: the rollback check misses something", made)
				}
				f.unstage(t, nc, m)
				f.leftNothing(t, name, vol.Status.Path)
			})
		}
	}
}

// leftNothing fails the test if anything of volume (image at image) is
// left on the node.
func (f *fixture) leftNothing(t *testing.T, volume, image string) {
	t.Helper()
	for _, l := range f.leftovers(t, volume, image) {
		t.Errorf("%s left", l)
	}
}

// leftovers lists what of volume (image at image) is on the node: mounts,
// loop devices, a FUSE connection held by the keeper, blockdev server
// processes, Attachment entries.
func (f *fixture) leftovers(t *testing.T, volume, image string) []string {
	t.Helper()
	var out []string
	points, _ := mountsUnder(f.dir)
	for _, p := range points {
		if strings.Contains(p+"/", "/"+volume+"/") {
			out = append(out, "mount at "+p)
		}
	}
	backing, _ := filepath.Glob("/sys/block/loop*/loop/backing_file")
	for _, b := range backing {
		file, err := os.ReadFile(b)
		// Only this fixture's files: another test run on the machine may
		// use the same volume names.
		if s := strings.TrimSpace(string(file)); err == nil && (s == image || strings.HasPrefix(s, f.dir+"/") && strings.Contains(s, "/"+volume+"/")) {
			out = append(out, "loop device "+filepath.Base(filepath.Dir(filepath.Dir(b)))+" on "+s)
		}
	}
	vols, err := keeper.NewClient(f.keeperSock).List(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range vols {
		if v.Name == volume {
			out = append(out, fmt.Sprintf("the keeper's FUSE connection %+v", v))
		}
	}
	for _, pid := range blockdevServers(volume, f.dir) {
		out = append(out, "blockdev server "+pid)
	}
	for _, p := range []string{filepath.Join(f.dir, "run", "blockdev", "_volumes", volume+".json"), filepath.Join(f.dir, "run", "blockdev", volume+".log")} {
		if _, err := os.Lstat(p); err == nil {
			out = append(out, "file "+p)
		}
	}
	att := &v1.Attachment{}
	if err := f.env.Client.Get(context.Background(), client.ObjectKey{Name: volume}, att); !apierrors.IsNotFound(err) {
		out = append(out, fmt.Sprintf("Attachment entries %+v (%v)", att.Spec.Attachments, err))
	}
	return out
}

// blockdevServers lists the pids of `berth blockdev --volume <volume>`
// whose mountpoint lies under dir (this fixture's, not another run's).
func blockdevServers(volume, dir string) []string {
	cmdlines, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	var pids []string
	for _, c := range cmdlines {
		b, err := os.ReadFile(c)
		if err != nil {
			continue
		}
		args := strings.Split(string(bytes.TrimRight(b, "\x00")), "\x00")
		if i := slices.Index(args, "--volume"); slices.Contains(args, "blockdev") && i >= 0 && i+1 < len(args) && args[i+1] == volume &&
			slices.ContainsFunc(args, func(a string) bool { return strings.HasPrefix(a, dir+"/") }) {
			pids = append(pids, filepath.Base(filepath.Dir(c)))
		}
	}
	return pids
}
