package fence

import (
	"maps"
	"strings"
	"testing"

	v1 "github.com/berth-io/berth/api/v1alpha1"
)

// TestHashedKeyMatchesEveryHashedName: the expression the agent's
// admission policy shares (hashedKey) matches the key of every name that
// NodeLabelKey hashes, so the policy never lets a hashed key go while a
// long-named node holds an entry.
func TestHashedKeyMatchesEveryHashedName(t *testing.T) {
	for _, node := range []string{strings.Repeat("n", 64), strings.Repeat("rack-17.zone-b.", 12) + "node-0042",
		strings.Repeat("a", 45) + "-.-" + strings.Repeat("b", 30), "-." + strings.Repeat("x", 80), strings.Repeat("7", 70)} {
		if !hashedName(node) {
			t.Errorf("%q is not hashed", node)
		}
		if key := NodeLabelKey(node); !hashedKey.MatchString(key) {
			t.Errorf("key %s of %q does not match %s", key, node, hashedKey)
		}
	}
	for _, node := range []string{"node-a", strings.Repeat("n", 63)} {
		if hashedName(node) || hashedKey.MatchString(NodeLabelKey(node)) {
			t.Errorf("%q is taken for hashed", node)
		}
	}
}

// TestSetNodeLabels: exact, the labels are the entries' nodes'; for an
// agent, a key that may be a hash stays while a long-named node holds an
// entry (the admission policy refuses its removal then), and every other
// stale key goes.
func TestSetNodeLabels(t *testing.T) {
	long, gone := strings.Repeat("l", 70), strings.Repeat("g", 70)
	lookalike := "web-0123456789abcdef" // a plain name shaped like a hashed key
	stale := map[string]string{NodeLabelKey("a"): "true", NodeLabelKey("b"): "true", NodeLabelKey(gone): "true",
		NodeLabelKey(lookalike): "true", "app": "db"}
	for _, c := range []struct {
		name  string
		nodes []string
		exact bool
		want  []string
	}{
		{"exact", []string{long, "a"}, true, []string{long, "a"}},
		{"agent beside a long name", []string{long, "a"}, false, []string{long, "a", gone, lookalike}},
		{"agent, no long name", []string{"a"}, false, []string{"a"}},
		{"agent, long name gone too", []string{"c"}, false, []string{"c"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			att := &v1.Attachment{}
			att.Labels = maps.Clone(stale)
			for _, n := range c.nodes {
				att.Spec.Attachments = append(att.Spec.Attachments, v1.AttachmentEntry{Node: n, MountDir: "/m"})
			}
			setNodeLabels(att, c.exact)
			want := map[string]string{"app": "db", LabeledLabel: "true"}
			for _, n := range c.want {
				want[NodeLabelKey(n)] = "true"
			}
			if !maps.Equal(att.Labels, want) {
				t.Errorf("labels %v, want %v", att.Labels, want)
			}
			if got, wantStale := staleNodeLabels(att), len(c.want) > len(c.nodes); got != wantStale {
				t.Errorf("staleNodeLabels = %v, want %v", got, wantStale)
			}
		})
	}
}
