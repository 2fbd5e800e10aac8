package controller

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/record"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/berth-io/berth/api/v1alpha1"
	"github.com/berth-io/berth/internal/mount"
)

// After a failover (remountRequestedAt) and once the share runs again, the
// agent of a node checks its pods' mounts of the volume: a broken one's pod
// is deleted when a controller owns it, else it gets a Warning Event; a
// mount that answers, another node's pod, a share not running yet and a
// request already handled cause nothing. The real probe (a stat through
// the kernel NFS client) cannot run here (no NFS client on these
// machines); mount.ProbeShare is tested on the fake mounter.
func TestShareMountRestartsPodsWithBrokenMounts(t *testing.T) {
	suite.Require(t)
	ctx := context.Background()
	const node = "share-node"
	owned := sharePod(ctx, t, "owned", node, true)
	bare := sharePod(ctx, t, "bare", node, false)
	healthy := sharePod(ctx, t, "healthy", node, true)
	// The share manager's own pod holds the device (a block publish), no
	// NFS mount: never restarted by this.
	manager := sharePod(ctx, t, "share-manager", node, true)
	elsewhere := sharePod(ctx, t, "elsewhere", "other-node", true)

	vol := &v1.Volume{ObjectMeta: metav1.ObjectMeta{Name: "share-vol"},
		Spec: v1.VolumeSpec{StorageCluster: "c", Size: resource.MustParse("16Mi"), AccessMode: v1.ReadWriteMany, FSType: "ext4"}}
	mustCreate(ctx, t, vol)
	att := &v1.Attachment{ObjectMeta: metav1.ObjectMeta{Name: vol.Name}, Spec: v1.AttachmentSpec{AccessMode: v1.ReadWriteMany}}
	for _, p := range []*corev1.Pod{owned, bare, healthy, manager, elsewhere} {
		att.Spec.Attachments = append(att.Spec.Attachments, v1.AttachmentEntry{Node: p.Spec.NodeName,
			PodNamespace: p.Namespace, Pod: p.Name, PodUID: string(p.UID), MountDir: "/pods/" + p.Name + "/mount"})
	}
	mustCreate(ctx, t, att)

	var mu sync.Mutex
	var probed []string
	events := record.NewFakeRecorder(10)
	r := &ShareMountReconciler{Client: env.Client, Node: node, Recorder: events, Log: testr.New(t),
		Probe: func(_ context.Context, path string) error {
			mu.Lock()
			defer mu.Unlock()
			probed = append(probed, path)
			if strings.Contains(path, "healthy") {
				return nil
			}
			if strings.Contains(path, "share-manager") {
				return fmt.Errorf("%s: %w", path, mount.ErrNotShareMount)
			}
			return errors.New("stale file handle")
		}}
	req := ctrl.Request{NamespacedName: client.ObjectKeyFromObject(vol)}
	reconcile := func() {
		t.Helper()
		if _, err := r.Reconcile(ctx, req); err != nil {
			t.Fatal(err)
		}
	}

	reconcile() // no remount asked
	vol.Status.RemountRequestedAt = ptr.To(metav1.Now())
	vol.Status.ShareState = v1.ShareStarting
	if err := env.Client.Status().Update(ctx, vol); err != nil {
		t.Fatal(err)
	}
	reconcile() // the share is not back yet
	if len(probed) != 0 {
		t.Fatalf("probed %v before the share runs again", probed)
	}
	vol.Status.ShareState = v1.ShareRunning
	if err := env.Client.Status().Update(ctx, vol); err != nil {
		t.Fatal(err)
	}
	reconcile()
	reconcile() // handled once
	if len(probed) != 4 {
		t.Errorf("probed %v; want this node's four mounts, once", probed)
	}
	if !going(ctx, t, owned) {
		t.Error("the owned pod with a broken mount was not deleted")
	}
	for _, p := range []*corev1.Pod{bare, healthy, manager, elsewhere} {
		if going(ctx, t, p) {
			t.Errorf("pod %s was deleted", p.Name)
		}
	}
	close(events.Events)
	var got []string
	for e := range events.Events {
		got = append(got, e)
	}
	if len(got) != 2 || !strings.Contains(strings.Join(got, "\n"), ReasonShareRemount) || !strings.Contains(strings.Join(got, "\n"), ReasonShareMountBroken) {
		t.Errorf("events %q; want one %s (owned) and one %s (bare)", got, ReasonShareRemount, ReasonShareMountBroken)
	}
}

// sharePod makes a pod on node, owned by a controller when owned.
func sharePod(ctx context.Context, t *testing.T, name, node string, owned bool) *corev1.Pod {
	t.Helper()
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		Spec: corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "c", Image: "busybox"}}}}
	if owned {
		p.OwnerReferences = []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: name + "-rs",
			UID: "0b3a1f2e-0000-4000-8000-000000000001", Controller: ptr.To(true)}}
	}
	mustCreate(ctx, t, p)
	return p
}

func mustCreate(ctx context.Context, t *testing.T, o client.Object) {
	t.Helper()
	if err := env.Client.Create(ctx, o); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = env.Client.Delete(context.Background(), o, client.GracePeriodSeconds(0))
	})
}

// going tells whether p is deleted or being deleted.
func going(ctx context.Context, t *testing.T, p *corev1.Pod) bool {
	t.Helper()
	var got corev1.Pod
	err := env.Client.Get(ctx, client.ObjectKeyFromObject(p), &got)
	if apierrors.IsNotFound(err) {
		return true
	}
	if err != nil {
		t.Fatal(err)
	}
	return !got.DeletionTimestamp.IsZero()
}

// A shared volume not of this node (a ceph one, with no node label, and a
// local one whose image is on another node), so not in an agent's cache of
// its node's Volumes, whose share failed over reaches the share-mount check
// of an agent whose pod mounts it, through its cache of SharedVolumes. The
// local one was missed on a VM node: only the image's node saw it.
func TestShareMountWatchesSharedVolumesOfAnyNode(t *testing.T) {
	suite.Require(t)
	ctx := context.Background()
	const node = "share-mount-any-node"
	probed := make(chan string, 4)
	startAgentManager(t, node, (&ShareMountReconciler{Client: env.Client, Node: node, Recorder: record.NewFakeRecorder(10), Log: testr.New(t),
		Probe: func(_ context.Context, path string) error { probed <- path; return nil }}).SetupWithManager)
	for _, c := range []struct{ name, volNode string }{{"share-mount-ceph", ""}, {"share-mount-other-node", "image-node"}} {
		pod := sharePod(ctx, t, c.name+"-web", node, true)
		labels := map[string]string{v1.SharedLabel: "true"} // as the operator labels it
		if c.volNode != "" {
			labels[v1.NodeLabel] = c.volNode
		}
		vol := &v1.Volume{ObjectMeta: metav1.ObjectMeta{Name: c.name, Labels: labels},
			Spec: v1.VolumeSpec{StorageCluster: "c", Node: c.volNode, Size: resource.MustParse("16Mi"), AccessMode: v1.ReadWriteMany, FSType: "ext4"}}
		mustCreate(ctx, t, vol)
		mountDir := "/pods/" + c.name + "/mount"
		mustCreate(ctx, t, &v1.Attachment{ObjectMeta: metav1.ObjectMeta{Name: vol.Name}, Spec: v1.AttachmentSpec{AccessMode: v1.ReadWriteMany,
			Attachments: []v1.AttachmentEntry{{Node: node, PodNamespace: pod.Namespace, Pod: pod.Name, PodUID: string(pod.UID), MountDir: mountDir}}}})
		vol.Status.RemountRequestedAt = ptr.To(metav1.Now())
		vol.Status.ShareState = v1.ShareRunning
		if err := env.Client.Status().Update(ctx, vol); err != nil {
			t.Fatal(err)
		}
		select {
		case p := <-probed:
			if p != mountDir {
				t.Errorf("%s: probed %s, want %s", c.name, p, mountDir)
			}
		case <-time.After(20 * time.Second):
			t.Fatalf("the remount request of %s (node %q) did not reach the agent", c.name, c.volNode)
		}
	}
}
