package deploy_test

import (
	"context"
	"strings"
	"testing"

	"github.com/go-logr/logr"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/record"
	"k8s.io/utils/clock"

	v1 "github.com/berth-io/berth/api/v1alpha1"
	"github.com/berth-io/berth/internal/fence"
)

// TestAgentKeepsHashedNodeLabels (F4 follow-up): the label key of a node
// name over 63 characters is hashed (fence.NodeLabelKey), which the
// policy's CEL cannot compute. Before, no entry's name matched the hashed
// key, so any agent could take it off while that node still held entries,
// hiding them from that node's ListForNode. Now no key that may be a hash
// is removed while a long-named node holds an entry: the agent's Fencer
// keeps it, and plain keys still go.
func TestAgentKeepsHashedNodeLabels(t *testing.T) {
	ctx := installAgentPolicy(t)
	admin := env.Client
	// Two 70-character node names (DNS subdomains).
	longA, longB := strings.Repeat("a", 50)+".rack-17.zone-b", strings.Repeat("b", 50)+".rack-17.zone-b"
	longA, longB = longA+strings.Repeat("x", 70-len(longA)), longB+strings.Repeat("x", 70-len(longB))
	mountDir := "/var/lib/kubelet/plugins/berth.io/pv/vol-long/globalmount"
	att := &v1.Attachment{ObjectMeta: metav1.ObjectMeta{Name: "vol-long", Labels: map[string]string{
		fence.NodeLabelKey(longB): "true", fence.NodeLabelKey("node-a"): "true", fence.LabeledLabel: "true"}},
		Spec: v1.AttachmentSpec{AccessMode: v1.ReadWriteMany, Attachments: []v1.AttachmentEntry{
			{Node: longB, MountDir: mountDir}, {Node: "node-a", MountDir: mountDir}}}}
	if err := admin.Create(ctx, att); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = admin.Delete(context.Background(), att) })

	agents := map[string]*fence.Fencer{}
	for _, node := range []string{"node-a", longA} {
		agents[node] = fence.New(agentClient(t, node), record.NewFakeRecorder(100), clock.RealClock{}, logr.Discard(),
			fence.Options{AskOperator: true})
	}
	labels := func() map[string]string {
		return get(ctx, t, &v1.Attachment{ObjectMeta: metav1.ObjectMeta{Name: "vol-long"}}).Labels
	}

	for _, node := range []string{"node-a", longA} {
		hidden := get(ctx, t, &v1.Attachment{ObjectMeta: metav1.ObjectMeta{Name: "vol-long"}})
		delete(hidden.Labels, fence.NodeLabelKey(longB))
		if err := agentClient(t, node).Update(ctx, hidden); !isPolicyDenial(err) {
			t.Errorf("agent of %s takes the hashed label of %s off while it holds the volume: %v, want refused by the policy",
				node, longB, err)
		}
	}

	// A plain key goes beside a long-named holder.
	if err := agents["node-a"].Release(ctx, "vol-long", "node-a", mountDir); err != nil {
		t.Fatalf("node-a releases beside %s: %v", longB, err)
	}
	if l := labels(); l[fence.NodeLabelKey("node-a")] != "" || l[fence.NodeLabelKey(longB)] == "" {
		t.Errorf("labels after node-a's release: %v, want %s's only", l, longB)
	}

	// A long-named agent comes and goes: its own hashed key stays (stale)
	// while longB holds an entry, and its writes are admitted.
	own := fence.Request{Volume: "vol-long", Node: longA, MountDir: mountDir, AccessMode: v1.ReadWriteMany}
	if err := agents[longA].Acquire(ctx, own); err != nil {
		t.Fatalf("%s acquires: %v", longA, err)
	}
	if err := agents[longA].Release(ctx, "vol-long", longA, mountDir); err != nil {
		t.Fatalf("%s releases beside %s: %v", longA, longB, err)
	}
	got := get(ctx, t, &v1.Attachment{ObjectMeta: metav1.ObjectMeta{Name: "vol-long"}})
	if len(got.Spec.Attachments) != 1 || got.Spec.Attachments[0].Node != longB {
		t.Errorf("entries after %s's release: %+v, want %s's only", longA, got.Spec.Attachments, longB)
	}
	if got.Labels[fence.NodeLabelKey(longA)] == "" || got.Labels[fence.NodeLabelKey(longB)] == "" {
		t.Errorf("labels after %s's release: %v, want both hashed keys", longA, got.Labels)
	}

	// Once no long-named node holds an entry, hashed keys go too.
	got.Spec.Attachments = []v1.AttachmentEntry{{Node: "node-a", MountDir: mountDir}} // longB let go (the admin plays its agent)
	got.Labels[fence.NodeLabelKey("node-a")] = "true"
	if err := admin.Update(ctx, got); err != nil {
		t.Fatal(err)
	}
	stale := get(ctx, t, &v1.Attachment{ObjectMeta: metav1.ObjectMeta{Name: "vol-long"}})
	delete(stale.Labels, fence.NodeLabelKey(longA))
	delete(stale.Labels, fence.NodeLabelKey(longB))
	if err := agentClient(t, "node-a").Update(ctx, stale); err != nil {
		t.Errorf("node-a drops stale hashed labels once no long-named node holds the volume: %v", err)
	}
}
