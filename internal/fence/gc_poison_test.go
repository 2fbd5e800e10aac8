package fence_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/record"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	v1 "github.com/berth-io/berth/api/v1alpha1"
	"github.com/berth-io/berth/internal/fence"
)

// TestAttachmentPodFieldsValidated (F13): the API server refuses an
// Attachment entry whose pod fields no pod can have (a name with "/",
// which made client-go fail every GC pass, a namespace that is no DNS
// label, a UID with path characters, a node name that is no DNS name),
// and takes the shapes real entries have (a stage record, a pod with a
// UUID, a static pod's hash UID).
func TestAttachmentPodFieldsValidated(t *testing.T) {
	suite.Require(t)
	ctx := ctxT(t)
	entry := func(mod func(e *v1.AttachmentEntry)) *v1.Attachment {
		e := v1.AttachmentEntry{Node: "node-a", PodNamespace: "default", Pod: "web-0",
			PodUID: "0b5e4c1a-9d2f-4a61-8c3e-5f7a1b2c3d4e", MountDir: "/var/lib/kubelet/pods/x/volumes/v"}
		mod(&e)
		return &v1.Attachment{ObjectMeta: metav1.ObjectMeta{Name: "vol-validate"},
			Spec: v1.AttachmentSpec{AccessMode: v1.ReadWriteOnce, Attachments: []v1.AttachmentEntry{e}}}
	}
	for _, c := range []struct {
		name, field string
		mod         func(e *v1.AttachmentEntry)
	}{
		{"pod name with a slash", "pod", func(e *v1.AttachmentEntry) { e.Pod = "a/b" }},
		{"pod name upper case", "pod", func(e *v1.AttachmentEntry) { e.Pod = "Web" }},
		{"pod name too long", "pod", func(e *v1.AttachmentEntry) { e.Pod = strings.Repeat("a", 254) }},
		{"namespace with a dot", "podNamespace", func(e *v1.AttachmentEntry) { e.PodNamespace = "x.y" }},
		{"namespace too long", "podNamespace", func(e *v1.AttachmentEntry) { e.PodNamespace = strings.Repeat("n", 64) }},
		{"uid with a path", "podUID", func(e *v1.AttachmentEntry) { e.PodUID = "../x" }},
		{"uid with a space", "podUID", func(e *v1.AttachmentEntry) { e.PodUID = "u 1" }},
		{"node with a slash", "node", func(e *v1.AttachmentEntry) { e.Node = "a/b" }},
	} {
		err := env.Client.Create(ctx, entry(c.mod))
		if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), c.field) {
			t.Errorf("%s: %v, want Invalid on %s", c.name, err, c.field)
		}
		if err == nil {
			_ = env.Client.Delete(ctx, entry(c.mod))
		}
	}
	for _, c := range []struct {
		name string
		mod  func(e *v1.AttachmentEntry)
	}{
		{"pod with a UUID", func(*v1.AttachmentEntry) {}},
		{"static pod", func(e *v1.AttachmentEntry) {
			e.Pod, e.PodUID = "etcd-node-a.example", "6d4f1c1e8b2a4f7c9e0d3b5a7c9e1f20"
		}},
		{"stage record", func(e *v1.AttachmentEntry) { e.PodNamespace, e.Pod, e.PodUID = "", "", "" }},
	} {
		att := entry(c.mod)
		if err := env.Client.Create(ctx, att); err != nil {
			t.Errorf("%s refused: %v", c.name, err)
			continue
		}
		_ = env.Client.Delete(ctx, att)
	}
}

// TestGCSkipsEntriesItCannotJudge (F13): one Attachment entry whose pod
// fields are invalid (stored before the CRD checked them: here the API
// server's answer is rewritten) and one whose pod lookup fails (an API
// error) are logged, counted, told as Events and left in place; the same
// pass still moves another volume's entry of a gone pod and marks a gone
// node's stale list. Main before the fix ended the pass at the first of
// them, "0-..." sorting first.
func TestGCSkipsEntriesItCannotJudge(t *testing.T) {
	suite.Require(t)
	ctx := ctxT(t)
	if err := env.Client.DeleteAllOf(ctx, &v1.Attachment{}); err != nil {
		t.Fatal(err)
	}
	mkNode(t, "gcp-live")
	for _, vol := range []string{"0-gcp-invalid", "1-gcp-flaky", "vol-gcp-good"} {
		cleanupVolume(t, vol, "gcp-live", "gcp-gone")
	}
	f, _ := newFencer(t)
	for _, r := range []fence.Request{
		podReq("0-gcp-invalid", "gcp-live", fakePod("gcp-invalid"), v1.ReadWriteMany),
		podReq("1-gcp-flaky", "gcp-live", fakePod("gcp-flaky"), v1.ReadWriteMany),
		podReq("vol-gcp-good", "gcp-live", fakePod("gcp-gone-pod"), v1.ReadWriteMany),
	} {
		if err := f.Acquire(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	gone := &v1.NodeCleanup{ObjectMeta: metav1.ObjectMeta{Name: "gcp-gone"}, Spec: v1.NodeCleanupSpec{Entries: []v1.StaleAttachment{{
		Volume: "vol-x", MountDir: "/var/lib/kubelet/plugins/berth.io/pv/x/globalmount", Reason: v1.ReasonNodeGone, FoundAt: metav1.Now()}}}}
	create(t, gone)

	direct, err := client.NewWithWatch(env.Config, client.Options{Scheme: env.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	c := interceptor.NewClient(direct, interceptor.Funcs{Get: func(ctx context.Context, c client.WithWatch, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
		if _, pod := obj.(*corev1.Pod); pod && key.Name == "gcp-flaky" {
			return apierrors.NewServiceUnavailable("etcd leader changed")
		}
		if err := c.Get(ctx, key, obj, opts...); err != nil {
			return err
		}
		if att, ok := obj.(*v1.Attachment); ok && key.Name == "0-gcp-invalid" {
			att.Spec.Attachments[0].Pod = "a/b"
		}
		return nil
	}})
	reg := prometheus.NewRegistry()
	events := record.NewFakeRecorder(10)
	g, err := fence.NewGC(c, clocktesting.NewFakeClock(time.Now()), testr.New(t), reg, fence.Options{Events: events})
	if err != nil {
		t.Fatal(err)
	}
	res, err := g.RunOnce(ctx)
	t.Logf("pass: %+v, %v", res, err)
	if res.Moved != 1 || res.Skipped != 2 {
		t.Errorf("pass moved %d, skipped %d; want 1 and 2", res.Moved, res.Skipped)
	}
	if n := len(getAttachment(t, "0-gcp-invalid").Spec.Attachments); n != 1 {
		t.Errorf("the invalid entry's Attachment has %d entries, want it left as it was", n)
	}
	if n := len(getAttachment(t, "1-gcp-flaky").Spec.Attachments); n != 1 {
		t.Errorf("the entry whose pod lookup failed: %d entries left, want 1", n)
	}
	if err := env.Client.Get(ctx, clientKey("vol-gcp-good"), &v1.Attachment{}); !apierrors.IsNotFound(err) {
		t.Errorf("the gone pod's entry was not moved after the bad ones (Attachment: %v)", err)
	}
	if es := getCleanup(t, "gcp-live").Spec.Entries; len(es) != 1 || es[0].Volume != "vol-gcp-good" {
		t.Errorf("stale list of the live node: %+v, want the gone pod's entry", es)
	}
	if _, marked := getCleanup(t, "gcp-gone").Annotations[fence.NodeGoneSinceAnnotation]; !marked {
		t.Error("the pass stopped before pruning: the gone node's stale list is not marked")
	}
	if n := counter(t, reg, "berth_attachment_gc_entries_skipped_total"); n != 2 {
		t.Errorf("berth_attachment_gc_entries_skipped_total = %v, want 2", n)
	}
	close(events.Events)
	var skips int
	for ev := range events.Events {
		if strings.Contains(ev, fence.ReasonGCEntrySkipped) {
			skips++
		}
	}
	if skips != 2 {
		t.Errorf("%d %s Events, want one per skipped entry", skips, fence.ReasonGCEntrySkipped)
	}
}
