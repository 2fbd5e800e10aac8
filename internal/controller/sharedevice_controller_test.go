package controller

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/tools/record"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/berth-io/berth/api/v1alpha1"
	"github.com/berth-io/berth/internal/volerr"
)

// When an RWX filesystem volume's image grew (status.capacity), the agent
// of the node holding its share manager's stage grows the device, once per
// capacity; the agent of another node, an RWO volume and an RWX block
// volume (its workloads' NodeExpandVolume grows those) cause nothing; a
// device that cannot grow online (nbd) gets a Warning Event, not retries.
func TestShareDeviceGrowsOnTheShareManagersNode(t *testing.T) {
	suite.Require(t)
	ctx := context.Background()
	const node = "share-device-node"
	mk := func(name string, mode v1.AccessMode, volMode v1.VolumeMode, stagedOn string) *v1.Volume {
		t.Helper()
		vol := &v1.Volume{ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: v1.VolumeSpec{StorageCluster: "c", Size: resource.MustParse("16Mi"), AccessMode: mode, VolumeMode: volMode}}
		if volMode == v1.VolumeModeFilesystem {
			vol.Spec.FSType = "ext4"
		}
		mustCreate(ctx, t, vol)
		setCapacity(ctx, t, vol, "16Mi")
		staged := "/var/lib/kubelet/plugins/kubernetes.io/csi/volumeDevices/staging/share-manager-" + name
		mustCreate(ctx, t, &v1.Attachment{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: v1.AttachmentSpec{AccessMode: mode,
			Attachments: []v1.AttachmentEntry{{Node: stagedOn, MountDir: staged, StagingPath: staged}}}})
		return vol
	}
	here := mk("share-dev-here", v1.ReadWriteMany, v1.VolumeModeFilesystem, node)
	there := mk("share-dev-there", v1.ReadWriteMany, v1.VolumeModeFilesystem, "other-node")
	rwo := mk("share-dev-rwo", v1.ReadWriteOnce, v1.VolumeModeFilesystem, node)
	block := mk("share-dev-block", v1.ReadWriteMany, v1.VolumeModeBlock, node)
	nbd := mk("share-dev-nbd", v1.ReadWriteMany, v1.VolumeModeFilesystem, node)

	var grown []string
	events := record.NewFakeRecorder(10)
	r := &ShareDeviceReconciler{Client: env.Client, Node: node, Recorder: events, Log: testr.New(t),
		Grow: func(_ context.Context, volume string) (int64, error) {
			grown = append(grown, volume)
			if volume == nbd.Name {
				return 0, fmt.Errorf("served over nbd: %w", volerr.New(volerr.ErrPrecondition, "not supported"))
			}
			return 32 << 20, nil
		}}
	reconcileAll := func() {
		t.Helper()
		for _, v := range []*v1.Volume{here, there, rwo, block, nbd} {
			if _, err := r.Reconcile(ctx, ctrl.Request{NamespacedName: client.ObjectKeyFromObject(v)}); err != nil {
				t.Fatalf("%s: %v", v.Name, err)
			}
		}
	}
	// The agent's start: each shared volume staged here is refreshed once
	// (a device that grew while no agent ran).
	reconcileAll()
	reconcileAll()
	if want := []string{here.Name, nbd.Name}; !slices.Equal(grown, want) {
		t.Fatalf("grew %v, want %v (once each)", grown, want)
	}
	grown = nil
	for _, v := range []*v1.Volume{here, there, rwo, block, nbd} {
		setCapacity(ctx, t, v, "32Mi")
	}
	reconcileAll()
	reconcileAll()
	if want := []string{here.Name, nbd.Name}; !slices.Equal(grown, want) {
		t.Errorf("after the images grew: grew %v, want %v (once each)", grown, want)
	}
	close(events.Events)
	var got []string
	for e := range events.Events {
		got = append(got, e)
	}
	if len(got) != 2 || !strings.Contains(got[0], ReasonShareDeviceGrowsAtRestart) {
		t.Errorf("events %q, want one %s per nbd capacity", got, ReasonShareDeviceGrowsAtRestart)
	}
}

func setCapacity(ctx context.Context, t *testing.T, vol *v1.Volume, q string) {
	t.Helper()
	if err := env.Client.Get(ctx, client.ObjectKeyFromObject(vol), vol); err != nil {
		t.Fatal(err)
	}
	vol.Status.Capacity = ptr.To(resource.MustParse(q))
	if err := env.Client.Status().Update(ctx, vol); err != nil {
		t.Fatal(err)
	}
}

// Through a manager cached the way an agent's is (this node's Volumes only)
// plus the cache of shared Volumes: a ceph volume's and a local
// volume's capacity changes both reach the reconciler, which grows the
// device of each share manager staged here.
func TestShareDeviceWatchesCephVolumes(t *testing.T) {
	suite.Require(t)
	ctx := context.Background()
	const node = "share-watch-node"
	grew := make(chan string, 16)
	r := &ShareDeviceReconciler{Client: env.Client, Node: node, Recorder: record.NewFakeRecorder(10), Log: testr.New(t),
		Grow: func(_ context.Context, volume string) (int64, error) { grew <- volume; return 0, nil }}
	startAgentManager(t, node, r.SetupWithManager)
	mk := func(name, volNode string) *v1.Volume {
		vol := &v1.Volume{ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: v1.VolumeSpec{StorageCluster: "c", Node: volNode, Size: resource.MustParse("16Mi"), AccessMode: v1.ReadWriteMany, FSType: "ext4"}}
		// As the operator labels shared Volumes, and the CSI controller
		// local ones; ceph volumes get no node label.
		vol.Labels = map[string]string{v1.SharedLabel: "true"}
		if volNode != "" {
			vol.Labels[v1.NodeLabel] = volNode
		}
		mustCreate(ctx, t, vol)
		staged := "/var/lib/kubelet/plugins/kubernetes.io/csi/volumeDevices/staging/share-manager-" + name
		mustCreate(ctx, t, &v1.Attachment{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: v1.AttachmentSpec{AccessMode: v1.ReadWriteMany,
			Attachments: []v1.AttachmentEntry{{Node: node, MountDir: staged, StagingPath: staged}}}})
		return vol
	}
	local, cephVol := mk("share-watch-local", node), mk("share-watch-ceph", "")
	for _, v := range []*v1.Volume{local, cephVol} {
		setCapacity(ctx, t, v, "32Mi")
		select {
		case got := <-grew:
			if got != v.Name {
				t.Errorf("grew %s, want %s", got, v.Name)
			}
		case <-time.After(20 * time.Second):
			t.Fatalf("the capacity of %s (node %q) did not reach the reconciler", v.Name, v.Spec.Node)
		}
	}
}

// startAgentManager runs, until the test ends, a manager cached the way an
// agent's is (its node's Volumes only) with the agent's cache of
// SharedVolumes added, and the controller setup makes in it.
func startAgentManager(t *testing.T, node string, setup func(ctrl.Manager, ...cache.Cache) error) {
	t.Helper()
	env.RunManager(t, ctrl.Options{Cache: cache.Options{ByObject: map[client.Object]cache.ByObject{
		&v1.Volume{}: {Label: labels.SelectorFromSet(labels.Set{v1.NodeLabel: node})}}}}, func(mgr ctrl.Manager) error {
		shared, err := cache.New(env.Config, cache.Options{Scheme: env.Scheme, ByObject: map[client.Object]cache.ByObject{
			&v1.Volume{}: {Label: SharedVolumes()}}})
		if err != nil {
			return err
		}
		if err := mgr.Add(shared); err != nil {
			return err
		}
		return setup(mgr, shared)
	})
}
