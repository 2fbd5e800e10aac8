package fence

import (
	"errors"
	"fmt"
	"testing"

	v1 "github.com/berth-io/berth/api/v1alpha1"
	"github.com/berth-io/berth/internal/volerr"
)

func stage(node string) v1.AttachmentEntry {
	return v1.AttachmentEntry{Node: node, MountDir: "/staging"}
}

func pod(node, name string) v1.AttachmentEntry {
	return v1.AttachmentEntry{Node: node, PodNamespace: "ns", Pod: name, PodUID: "uid-" + name, MountDir: "/pods/" + name}
}

func reqFor(e v1.AttachmentEntry, mode v1.AccessMode) *Request {
	return &Request{Volume: "v", Node: e.Node, PodNamespace: e.PodNamespace, Pod: e.Pod, PodUID: e.PodUID,
		MountDir: e.MountDir, AccessMode: mode, ReadOnly: mode == v1.ReadOnlyMany}
}

// TestExcluded is the decision table of the access modes.
func TestExcluded(t *testing.T) {
	held := []v1.AttachmentEntry{stage("a"), pod("a", "p1")}
	cases := []struct {
		mode    v1.AccessMode
		req     v1.AttachmentEntry
		blocked int
	}{
		{v1.ReadWriteOnce, pod("a", "p2"), 0},
		{v1.ReadWriteOnce, stage("b"), 2},
		{v1.ReadWriteOnce, pod("b", "p2"), 2},
		{v1.ReadWriteOncePod, pod("a", "p2"), 1},
		{v1.ReadWriteOncePod, stage("b"), 2},
		{v1.ReadWriteOncePod, pod("b", "p1"), 2},
		{v1.ReadWriteMany, pod("b", "p2"), 0},
		{v1.ReadOnlyMany, pod("b", "p2"), 0},
	}
	for _, c := range cases {
		t.Run(fmt.Sprintf("%s/%s/%s", c.mode, c.req.Node, c.req.Pod), func(t *testing.T) {
			got, why := excluded(c.mode, held, reqFor(c.req, c.mode))
			if len(got) != c.blocked {
				t.Fatalf("blocked by %d entries (%s), want %d", len(got), why, c.blocked)
			}
		})
	}
	// Another mode than the one granted blocks on every holder.
	if got, _ := excluded(v1.ReadWriteMany, held, reqFor(pod("a", "p2"), v1.ReadWriteOnce)); len(got) != 2 {
		t.Fatalf("mode mismatch blocked by %d, want 2", len(got))
	}
}

func TestValidate(t *testing.T) {
	r := reqFor(stage("a"), v1.ReadOnlyMany)
	r.ReadOnly = false
	if err := r.validate(); err != nil || !r.ReadOnly {
		t.Fatalf("ReadOnlyMany stage: %v, readOnly %v; want accepted as read-only", err, r.ReadOnly)
	}
	r = reqFor(pod("a", "p"), v1.ReadOnlyMany)
	r.ReadOnly = false
	if err := r.validate(); !errors.Is(err, volerr.ErrInvalid) {
		t.Fatalf("read-write pod on ReadOnlyMany: %v, want volerr.ErrInvalid", err)
	}
}

func TestHoldersSummary(t *testing.T) {
	var att v1.Attachment
	entries := []v1.AttachmentEntry{stage("a"), pod("a", "p1")}
	for i := range 9 {
		entries = append(entries, stage(fmt.Sprint("n", i)))
	}
	setEntries(&att, entries, true)
	want := "a, a/ns/p1, n0, n1, n2, n3, n4, n5, +3 more"
	if att.Spec.Holders != want {
		t.Fatalf("holders %q, want %q", att.Spec.Holders, want)
	}
}
