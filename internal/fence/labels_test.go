package fence_test

import (
	"slices"
	"strings"
	"testing"

	"github.com/go-logr/logr/testr"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/tools/record"
	"k8s.io/utils/clock"

	v1 "github.com/berth-io/berth/api/v1alpha1"
	"github.com/berth-io/berth/internal/fence"
)

// longNode is a valid node name (a DNS subdomain) far past the 63
// characters of a label key's name part.
var longNode = strings.Repeat("rack-17.zone-b.", 12) + "node-0042"

func TestNodeLabelKey(t *testing.T) {
	seen := map[string]string{}
	for _, node := range []string{"a", "node-1.example.com", strings.Repeat("n", 63), strings.Repeat("n", 64),
		longNode, longNode[:len(longNode)-1] + "3", "-." + strings.Repeat("x", 80)} {
		key := fence.NodeLabelKey(node)
		if errs := validation.IsQualifiedName(key); len(errs) != 0 {
			t.Errorf("key of %q is not a valid label key: %s %v", node, key, errs)
		}
		if other, dup := seen[key]; dup {
			t.Errorf("nodes %q and %q share the key %s", node, other, key)
		}
		seen[key] = node
		if fence.NodeLabelKey(node) != key {
			t.Errorf("key of %q is not stable", node)
		}
	}
	if got := fence.NodeLabelKey("node-1.example.com"); got != fence.NodeLabelPrefix+"node-1.example.com" {
		t.Errorf("a short node name is hashed: %s", got)
	}
}

// TestListForNodeBySelector: Acquire and Release keep one label per
// holding node; ListForNode finds a node's holds by that label, and still
// finds them in Attachments written before labels existed.
func TestListForNodeBySelector(t *testing.T) {
	f, _ := newFencer(t)
	for _, v := range []string{"vol-lbl-rwx", "vol-lbl-long", "vol-lbl-legacy", "vol-lbl-foreign"} {
		cleanupVolume(t, v)
	}
	a := stageReq("vol-lbl-rwx", "lbl-a", v1.ReadWriteMany)
	mustAcquire(t, f, a)
	mustAcquire(t, f, stageReq("vol-lbl-rwx", longNode, v1.ReadWriteMany))
	mustAcquire(t, f, stageReq("vol-lbl-long", longNode, v1.ReadWriteOnce))
	att := getAttachment(t, "vol-lbl-rwx")
	for _, k := range []string{fence.NodeLabelKey("lbl-a"), fence.NodeLabelKey(longNode), fence.LabeledLabel} {
		if _, ok := att.Labels[k]; !ok {
			t.Errorf("Attachment lacks label %s: %v", k, att.Labels)
		}
	}
	if err := f.Release(ctxT(t), a.Volume, a.Node, a.MountDir); err != nil {
		t.Fatal(err)
	}
	if att = getAttachment(t, "vol-lbl-rwx"); att.Labels[fence.NodeLabelKey("lbl-a")] != "" {
		t.Errorf("released node's label kept: %v", att.Labels)
	}

	// Written before node labels: found by reading it.
	create(t, &v1.Attachment{ObjectMeta: metav1.ObjectMeta{Name: "vol-lbl-legacy"}, Spec: v1.AttachmentSpec{
		AccessMode: v1.ReadWriteOnce, Attachments: []v1.AttachmentEntry{{Node: "lbl-a", MountDir: "/legacy"}}}})
	// Labeled, but not for lbl-a: a selector never returns it for lbl-a.
	create(t, &v1.Attachment{ObjectMeta: metav1.ObjectMeta{Name: "vol-lbl-foreign", Labels: map[string]string{fence.LabeledLabel: "true"}},
		Spec: v1.AttachmentSpec{AccessMode: v1.ReadWriteOnce, Attachments: []v1.AttachmentEntry{{Node: "lbl-a", MountDir: "/foreign"}}}})

	volumes := func(node string) []string {
		holds, err := f.ListForNode(ctxT(t), node)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, h := range holds {
			out = append(out, h.Volume)
		}
		slices.Sort(out)
		return out
	}
	if got := volumes("lbl-a"); !slices.Equal(got, []string{"vol-lbl-legacy"}) {
		t.Errorf("holds of lbl-a: %v, want only the legacy Attachment's", got)
	}
	if got := volumes(longNode); !slices.Equal(got, []string{"vol-lbl-long", "vol-lbl-rwx"}) {
		t.Errorf("holds of the long-named node: %v", got)
	}
}

// TestGCDropsNodeLabelsAnAgentKept: an agent's Fencer (AskOperator) keeps
// the hashed label of a long-named node that let go while another
// long-named node holds the volume (its admission policy refuses the
// removal); the operator's GC drops it and leaves the entries.
func TestGCDropsNodeLabelsAnAgentKept(t *testing.T) {
	g, _ := newGC(t)
	other := strings.Replace(longNode, "node-0042", "node-0043", 1)
	mkNode(t, longNode)
	mkNode(t, other)
	cleanupVolume(t, "vol-lbl-kept")
	agent := fence.New(env.Client, record.NewFakeRecorder(10), clock.RealClock{}, testr.New(t), fence.Options{AskOperator: true})
	mustAcquire(t, agent, stageReq("vol-lbl-kept", longNode, v1.ReadWriteMany))
	r := stageReq("vol-lbl-kept", other, v1.ReadWriteMany)
	mustAcquire(t, agent, r)
	if err := agent.Release(ctxT(t), r.Volume, r.Node, r.MountDir); err != nil {
		t.Fatal(err)
	}
	if att := getAttachment(t, "vol-lbl-kept"); att.Labels[fence.NodeLabelKey(other)] == "" {
		t.Fatalf("the agent dropped the hashed label of %s beside %s: %v", other, longNode, att.Labels)
	}
	res, err := g.RunOnce(ctxT(t))
	if err != nil || res.Moved != 0 || res.Dropped != 0 {
		t.Fatalf("RunOnce = %+v, %v", res, err)
	}
	att := getAttachment(t, "vol-lbl-kept")
	if att.Labels[fence.NodeLabelKey(other)] != "" || att.Labels[fence.NodeLabelKey(longNode)] == "" {
		t.Errorf("labels after the GC: %v, want %s's only", att.Labels, longNode)
	}
	wantHolders(t, "vol-lbl-kept", longNode)
}
