// Package preflight tells whether berth is in a state to upgrade (or roll
// back) without a volume noticing: every StorageCluster ready, no volume
// in error or in the middle of a change, no share starting or failing
// over, no lock break or lost node's cleanup under way. An upgrade
// restarts every component; each of those is then left to a new version
// that may not finish it as the old one began.
package preflight

import (
	"context"
	"fmt"
	"sort"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/berth-io/berth/api/v1alpha1"
	"github.com/berth-io/berth/internal/fence"
)

// Finding is one thing that should settle before an upgrade.
type Finding struct {
	// Kind and Name name the object (Name is namespace/name when namespaced).
	Kind, Name string
	// Problem says what is wrong, and what to wait for or do.
	Problem string
}

func (f Finding) String() string { return fmt.Sprintf("%s %s: %s", f.Kind, f.Name, f.Problem) }

// Report is what Check saw.
type Report struct {
	Findings []Finding
	// Counts of what was checked, for the all-clear line.
	StorageClusters, Volumes, Shares, Nodes int
}

// OK tells whether nothing stands in an upgrade's way.
func (r Report) OK() bool { return len(r.Findings) == 0 }

// Check reads berth's objects (and the Nodes) through c; shareNamespace is
// where ShareManagers live (berth's namespace).
func Check(ctx context.Context, c client.Reader, shareNamespace string) (Report, error) {
	var r Report
	for _, step := range []func(context.Context, client.Reader, string, *Report) error{
		checkClusters, checkVolumes, checkShares, checkAttachments, checkCleanups, checkNodes,
	} {
		if err := step(ctx, c, shareNamespace, &r); err != nil {
			return Report{}, err
		}
	}
	sort.SliceStable(r.Findings, func(i, j int) bool {
		if r.Findings[i].Kind != r.Findings[j].Kind {
			return r.Findings[i].Kind < r.Findings[j].Kind
		}
		return r.Findings[i].Name < r.Findings[j].Name
	})
	return r, nil
}

func (r *Report) add(kind, name, format string, args ...any) {
	r.Findings = append(r.Findings, Finding{Kind: kind, Name: name, Problem: fmt.Sprintf(format, args...)})
}

func checkClusters(ctx context.Context, c client.Reader, _ string, r *Report) error {
	var list v1.StorageClusterList
	if err := c.List(ctx, &list); err != nil {
		return fmt.Errorf("list storageclusters: %w", err)
	}
	r.StorageClusters = len(list.Items)
	for _, sc := range list.Items {
		if sc.Status.Phase == v1.StorageClusterReady {
			continue
		}
		why := "no Ready condition yet"
		if cond := meta.FindStatusCondition(sc.Status.Conditions, v1.ConditionReady); cond != nil {
			why = cond.Reason + ": " + cond.Message
		}
		r.add("StorageCluster", sc.Name, "phase %q, not Ready (%s)", sc.Status.Phase, why)
	}
	return nil
}

func checkVolumes(ctx context.Context, c client.Reader, _ string, r *Report) error {
	var list v1.VolumeList
	if err := c.List(ctx, &list); err != nil {
		return fmt.Errorf("list volumes: %w", err)
	}
	r.Volumes = len(list.Items)
	for _, v := range list.Items {
		switch v.Status.State {
		case v1.VolumeAvailable, "":
		case v1.VolumeError:
			r.add("Volume", v.Name, "in Error: %s", v.Status.Message)
		default:
			r.add("Volume", v.Name, "%s: wait until it is Available", v.Status.State)
		}
	}
	return nil
}

func checkShares(ctx context.Context, c client.Reader, ns string, r *Report) error {
	var list v1.ShareManagerList
	if err := c.List(ctx, &list, client.InNamespace(ns)); err != nil {
		return fmt.Errorf("list sharemanagers in %s: %w", ns, err)
	}
	r.Shares = len(list.Items)
	for _, sm := range list.Items {
		switch sm.Status.State {
		case v1.ShareRunning, v1.ShareStopped:
		case v1.ShareError:
			r.add("ShareManager", sm.Namespace+"/"+sm.Name, "in error: its share is failing over or cannot start")
		default:
			r.add("ShareManager", sm.Namespace+"/"+sm.Name, "share %s: wait until it runs (a failover in progress rides on the NFS grace, which an upgrade restart would add to)", sm.Status.State)
		}
	}
	return nil
}

func checkAttachments(ctx context.Context, c client.Reader, _ string, r *Report) error {
	var list v1.AttachmentList
	if err := c.List(ctx, &list); err != nil {
		return fmt.Errorf("list attachments: %w", err)
	}
	for _, a := range list.Items {
		for _, t := range a.Spec.TakeOvers {
			r.add("Attachment", a.Name, "node %s waits for the operator to break another node's lock (since %s)", t.Node, t.RequestedAt.UTC().Format("15:04:05"))
		}
	}
	return nil
}

func checkCleanups(ctx context.Context, c client.Reader, _ string, r *Report) error {
	var list v1.NodeCleanupList
	if err := c.List(ctx, &list); err != nil {
		return fmt.Errorf("list nodecleanups: %w", err)
	}
	for _, nc := range list.Items {
		if n := len(nc.Spec.Entries); n > 0 {
			r.add("NodeCleanup", nc.Name, "%d stale entries for the node's agent to undo: wait, or see docs/operations.md#node-loss", n)
		}
	}
	return nil
}

func checkNodes(ctx context.Context, c client.Reader, _ string, r *Report) error {
	var list corev1.NodeList
	if err := c.List(ctx, &list); err != nil {
		return fmt.Errorf("list nodes: %w", err)
	}
	r.Nodes = len(list.Items)
	for i := range list.Items {
		if fence.OutOfService(&list.Items[i]) {
			r.add("Node", list.Items[i].Name, "tainted out-of-service (lost): upgrade once it is back or removed")
		}
	}
	return nil
}
