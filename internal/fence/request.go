package fence

import (
	"fmt"
	"strings"

	v1 "github.com/berth-io/berth/api/v1alpha1"
	"github.com/berth-io/berth/internal/volerr"
)

// Request asks to hold a volume on a node. A node's stage record leaves the
// pod fields empty and sets MountDir to the staging path (CSI NodeStage knows
// no pod); a pod's publish record sets all three pod fields and MountDir to
// the pod's target path. Under ReadOnlyMany a pod's request must be
// ReadOnly; a stage request is made read-only.
type Request struct {
	Volume       string
	Node         string
	PodNamespace string
	Pod          string
	PodUID       string
	MountDir     string
	StagingPath  string
	AccessMode   v1.AccessMode
	ReadOnly     bool
	// SoleDevice marks the share manager's hold on the device of a shared
	// (ReadWriteMany filesystem) volume: one node at a time may have the
	// device, so other nodes' device holds (their stage records and the
	// pod entries on those staging paths) block it as under ReadWriteOnce,
	// and are broken by the same rules, whatever the Attachment's mode.
	// The share's NFS clients (workload entries with no stage record
	// behind them) never block it.
	SoleDevice bool
	// Ceph marks a volume of a Ceph StorageCluster. Another node's holds
	// on it are broken only with that node's Ceph clients fenced, so a
	// node that holds the device with no client recorded keeps them: a
	// ConflictError, and no take-over request. A Fencer with an
	// Options.Blocklister takes every volume for a Ceph one.
	Ceph bool
}

// IsStage tells whether the request is for a node's stage record.
func (r *Request) IsStage() bool { return r.Pod == "" && r.PodUID == "" }

func (r *Request) entry() v1.AttachmentEntry {
	return v1.AttachmentEntry{
		Node:         r.Node,
		PodNamespace: r.PodNamespace,
		Pod:          r.Pod,
		PodUID:       r.PodUID,
		MountDir:     r.MountDir,
		StagingPath:  r.StagingPath,
		ReadOnly:     r.ReadOnly,
	}
}

// validate refuses a request that can never be granted; it marks a
// ReadOnlyMany stage request read-only.
func (r *Request) validate() error {
	switch {
	case r.Volume == "":
		return fmt.Errorf("%w: volume is empty", volerr.ErrInvalid)
	case r.Node == "":
		return fmt.Errorf("%w: volume %s: node is empty", volerr.ErrInvalid, r.Volume)
	case r.MountDir == "":
		return fmt.Errorf("%w: volume %s: mountDir is empty", volerr.ErrInvalid, r.Volume)
	}
	if pods := r.PodNamespace != "" || r.Pod != "" || r.PodUID != ""; pods && (r.PodNamespace == "" || r.Pod == "" || r.PodUID == "") {
		return fmt.Errorf("%w: volume %s: pod namespace, name and uid must be all set or all empty (got %q/%q uid %q)",
			volerr.ErrInvalid, r.Volume, r.PodNamespace, r.Pod, r.PodUID)
	}
	switch r.AccessMode {
	case v1.ReadWriteOncePod, v1.ReadWriteOnce, v1.ReadWriteMany:
	case v1.ReadOnlyMany:
		if r.IsStage() {
			// CSI NodeStage carries no read-only flag: the mode implies it.
			r.ReadOnly = true
		}
		if !r.ReadOnly {
			return fmt.Errorf("%w: volume %s is %s: a read-write mount is refused", volerr.ErrInvalid, r.Volume, r.AccessMode)
		}
	default:
		return fmt.Errorf("%w: volume %s: unknown access mode %q", volerr.ErrInvalid, r.Volume, r.AccessMode)
	}
	return nil
}

// sameKey tells whether e sits in the request's slot of the list-map.
func (r *Request) sameKey(e *v1.AttachmentEntry) bool {
	return e.Node == r.Node && e.MountDir == r.MountDir
}

// excluded returns the entries of others that the access mode forbids next
// to the request, and why. others must not contain the request's own slot.
func excluded(granted v1.AccessMode, others []v1.AttachmentEntry, r *Request) ([]v1.AttachmentEntry, string) {
	if len(others) == 0 {
		return nil, ""
	}
	if r.SoleDevice && granted == r.AccessMode {
		var out []v1.AttachmentEntry
		for _, e := range deviceHolds(others) {
			if e.Node != r.Node {
				out = append(out, e)
			}
		}
		return out, "the device of a shared volume is held on one node at a time"
	}
	if granted != r.AccessMode {
		// A volume is held under one mode at a time; the first holder set it.
		return others, fmt.Sprintf("held as %s, requested as %s", granted, r.AccessMode)
	}
	var out []v1.AttachmentEntry
	var why string
	for i := range others {
		e := &others[i]
		switch r.AccessMode {
		case v1.ReadWriteOnce:
			if e.Node != r.Node {
				out, why = append(out, *e), "ReadWriteOnce allows one node"
			}
		case v1.ReadWriteOncePod:
			// One pod on one node: another node's stage record blocks even a
			// stage request, and a second pod blocks on any node.
			if e.Node != r.Node {
				out, why = append(out, *e), "ReadWriteOncePod allows one pod on one node"
			} else if !e.IsStage() && !r.IsStage() && e.PodUID != r.PodUID {
				out, why = append(out, *e), "ReadWriteOncePod allows one pod"
			}
		}
	}
	return out, why
}

// deviceHolds are the entries that hold a volume's device: stage records,
// and pod entries whose staging path is a stage record of their node.
func deviceHolds(entries []v1.AttachmentEntry) []v1.AttachmentEntry {
	staged := map[[2]string]bool{}
	for _, e := range entries {
		if e.IsStage() {
			staged[[2]string{e.Node, e.MountDir}] = true
		}
	}
	var out []v1.AttachmentEntry
	for _, e := range entries {
		if e.IsStage() || staged[[2]string{e.Node, e.StagingPath}] {
			out = append(out, e)
		}
	}
	return out
}

// byNode groups entries by node, keeping first-seen node order.
func byNode(entries []v1.AttachmentEntry) ([]string, map[string][]v1.AttachmentEntry) {
	var order []string
	m := map[string][]v1.AttachmentEntry{}
	for _, e := range entries {
		if _, ok := m[e.Node]; !ok {
			order = append(order, e.Node)
		}
		m[e.Node] = append(m[e.Node], e)
	}
	return order, m
}

// maxListedHolders bounds spec.holders; the list itself has them all.
const maxListedHolders = 8

// setEntries writes the holders, their kubectl summary and the node
// labels together (exact: see setNodeLabels).
func setEntries(att *v1.Attachment, entries []v1.AttachmentEntry, exact bool) {
	att.Spec.Attachments = entries
	names := make([]string, 0, min(len(entries), maxListedHolders)+1)
	for i, e := range entries {
		if i == maxListedHolders {
			names = append(names, fmt.Sprintf("+%d more", len(entries)-i))
			break
		}
		if e.IsStage() {
			names = append(names, e.Node)
		} else {
			names = append(names, e.Node+"/"+e.PodNamespace+"/"+e.Pod)
		}
	}
	att.Spec.Holders = strings.Join(names, ", ")
	setNodeLabels(att, exact)
}
