package deploy_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/go-logr/logr"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/record"
	"k8s.io/utils/clock"

	v1 "github.com/berth-io/berth/api/v1alpha1"
	"github.com/berth-io/berth/internal/fence"
)

// TestAgentPolicyOnABusyAttachment (F16): an RWX Attachment as full as
// its schema allows (1024 entries, 64 nodes) is still written by the
// agent through the admission policy, whose rules (each entry looked up
// in the other list) stay within the API server's CEL cost limit; and the
// policy still refuses what it must there. The review feared the limit
// would refuse the agent's own writes, failing closed; on Kubernetes 1.34
// it does not.
func TestAgentPolicyOnABusyAttachment(t *testing.T) {
	ctx := installAgentPolicy(t)
	admin, a := env.Client, agentClient(t, "node-a")

	const nodes, perNode = 64, 16
	busy := &v1.Attachment{ObjectMeta: metav1.ObjectMeta{Name: "busy"}, Spec: v1.AttachmentSpec{AccessMode: v1.ReadWriteMany}}
	for n := range nodes {
		for p := range perNode {
			if n == 0 && p == perNode-1 {
				continue // room for node-a's own entry
			}
			uid := fmt.Sprintf("uid-%d-%d", n, p)
			busy.Spec.Attachments = append(busy.Spec.Attachments, v1.AttachmentEntry{
				Node: fmt.Sprintf("node-%d", n), MountDir: "/var/lib/kubelet/pods/" + uid + "/volumes/kubernetes.io~csi/busy/mount",
				PodNamespace: "default", Pod: fmt.Sprintf("web-%d-%d", n, p), PodUID: uid,
			})
		}
	}
	if err := admin.Create(ctx, busy); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = admin.Delete(context.Background(), busy) })
	for n := range nodes {
		busy.Status.Nodes = append(busy.Status.Nodes, v1.AttachmentNodeStatus{Node: fmt.Sprintf("node-%d", n), DevicePath: "/dev/loop1", Staged: true})
	}
	if err := admin.Status().Update(ctx, busy); err != nil {
		t.Fatal(err)
	}

	fencer := fence.New(a, record.NewFakeRecorder(100), clock.RealClock{}, logr.Discard(), fence.Options{})
	own := fence.Request{Volume: "busy", Node: "node-a", AccessMode: v1.ReadWriteMany,
		MountDir:     "/var/lib/kubelet/pods/uid-a/volumes/kubernetes.io~csi/busy/mount",
		PodNamespace: "default", Pod: "web-a", PodUID: "uid-a"}
	if err := fencer.Acquire(ctx, own); err != nil {
		t.Fatalf("own entry beside %d others: %v", len(busy.Spec.Attachments), err)
	}
	if err := fencer.ReportStaged(ctx, "busy", fence.Staged{Node: "node-a", DevicePath: "/dev/loop2"}); err != nil {
		t.Fatalf("own status beside %d nodes': %v", nodes, err)
	}

	got := get(ctx, t, &v1.Attachment{ObjectMeta: metav1.ObjectMeta{Name: "busy"}})
	if n := len(got.Spec.Attachments); n != nodes*perNode {
		t.Fatalf("entries: %d, want %d", n, nodes*perNode)
	}
	changed := got.DeepCopy()
	changed.Spec.Attachments[0].StagingPath = "/elsewhere"
	if err := a.Update(ctx, changed); !isPolicyDenial(err) {
		t.Errorf("change another node's entry of a busy Attachment: %v, want refused by the policy", err)
	}
	status := got.DeepCopy()
	status.Status.Nodes[0].DevicePath = "/dev/loop9" // node-0's
	if err := a.Status().Update(ctx, status); !isPolicyDenial(err) {
		t.Errorf("change another node's status entry of a busy Attachment: %v, want refused by the policy", err)
	}
}
