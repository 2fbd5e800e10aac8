package fence

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"regexp"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/selection"
	"k8s.io/apimachinery/pkg/util/validation"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/berth-io/berth/api/v1alpha1"
)

// Every node holding an entry of an Attachment has a label on it, so that a
// node's holds are listed with a selector instead of by reading every
// Attachment in the cluster.
const (
	// NodeLabelPrefix starts the label key of a holding node (NodeLabelKey).
	NodeLabelPrefix = "node.attachment.berth.io/"
	// LabeledLabel marks an Attachment whose node labels are kept; one
	// without it was written before they existed and is read in full.
	LabeledLabel = "attachment.berth.io/node-labels"
	labelValue   = "true"
	// A label key's name part holds at most 63 characters; longer node
	// names keep a readable head and a hash of the whole name.
	maxLabelName = validation.LabelValueMaxLength
	hashChars    = 16
)

// NodeLabelKey is the label key marking Attachments that node holds entries
// in. It is valid for any node name: names too long or not valid as a
// label key's name part are shortened and hashed.
func NodeLabelKey(node string) string {
	if len(validation.IsQualifiedName(NodeLabelPrefix+node)) == 0 {
		return NodeLabelPrefix + node
	}
	sum := sha256.Sum256([]byte(node))
	head := node[:min(len(node), maxLabelName-hashChars-1)]
	// The head must start and end with an alphanumeric character.
	head = strings.TrimFunc(head, func(r rune) bool { return !isAlnum(r) })
	if head != "" {
		head += "-"
	}
	return NodeLabelPrefix + head + hex.EncodeToString(sum[:])[:hashChars]
}

func isAlnum(r rune) bool {
	return (r >= 'a' && r <= 'z') || (r >= 'A' && r <= 'Z') || (r >= '0' && r <= '9')
}

// hashedKey matches every key NodeLabelKey hashes (and plain keys that
// look alike): a name part ending in hashChars hex digits, alone or after
// a dash. The agent's admission policy uses the same expression.
var hashedKey = regexp.MustCompile(fmt.Sprintf(`^%s(.*-)?[0-9a-f]{%d}$`, regexp.QuoteMeta(NodeLabelPrefix), hashChars))

// hashedName tells whether NodeLabelKey hashes node.
func hashedName(node string) bool {
	return len(validation.IsQualifiedName(NodeLabelPrefix+node)) != 0
}

// setNodeLabels makes the node labels of att match its entries. With exact
// false (an agent's write) it keeps a stale label that the agent's
// admission policy would not let it remove. The policy cannot hash a node
// name, so while an entry of a hashed name remains, no key that may be a
// hash (hashedKey) is removed. A stale label is harmless: ListForNode
// reads the entries. The operator writes exactly and drops it (GC).
func setNodeLabels(att *v1.Attachment, exact bool) {
	if att.Labels == nil {
		att.Labels = map[string]string{}
	}
	keepHashed := !exact && slices.ContainsFunc(att.Spec.Attachments, func(e v1.AttachmentEntry) bool { return hashedName(e.Node) })
	for k := range att.Labels {
		if strings.HasPrefix(k, NodeLabelPrefix) && !(keepHashed && hashedKey.MatchString(k)) {
			delete(att.Labels, k)
		}
	}
	for _, e := range att.Spec.Attachments {
		att.Labels[NodeLabelKey(e.Node)] = labelValue
	}
	att.Labels[LabeledLabel] = labelValue
}

// staleNodeLabels tells whether att has a node label of a node that holds
// no entry of it (kept by an agent, setNodeLabels).
func staleNodeLabels(att *v1.Attachment) bool {
	for k := range att.Labels {
		if strings.HasPrefix(k, NodeLabelPrefix) && !slices.ContainsFunc(att.Spec.Attachments, func(e v1.AttachmentEntry) bool {
			return NodeLabelKey(e.Node) == k
		}) {
			return true
		}
	}
	return false
}

// ListForNode returns every entry the node holds, across all volumes (the
// volume healer's starting point after an agent restart): the Attachments
// labeled for the node, and those written before node labels existed.
func (f *Fencer) ListForNode(ctx context.Context, node string) ([]Hold, error) {
	var held, legacy v1.AttachmentList
	if err := f.c.List(ctx, &held, client.HasLabels{NodeLabelKey(node)}); err != nil {
		return nil, fmt.Errorf("list attachments of node %s: %w", node, err)
	}
	unlabeled, err := labels.NewRequirement(LabeledLabel, selection.DoesNotExist, nil)
	if err != nil {
		return nil, fmt.Errorf("selector: %w", err)
	}
	if err := f.c.List(ctx, &legacy, client.MatchingLabelsSelector{Selector: labels.NewSelector().Add(*unlabeled)}); err != nil {
		return nil, fmt.Errorf("list attachments without node labels: %w", err)
	}
	var out []Hold
	for _, att := range append(held.Items, legacy.Items...) {
		for _, e := range att.Spec.Attachments {
			// A hashed key may in theory be shared: the entry decides.
			if e.Node == node {
				out = append(out, Hold{Volume: att.Name, Mode: att.Spec.AccessMode, Entry: e})
			}
		}
	}
	return out, nil
}
