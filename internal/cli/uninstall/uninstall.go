// Package uninstall is the `berth uninstall` command, which the chart runs
// as a pre-delete hook: it removes what the operator deployed (which Helm
// does not know of), and refuses while berth still holds data.
package uninstall

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/berth-io/berth/api/v1alpha1"
	"github.com/berth-io/berth/internal/cli"
	"github.com/berth-io/berth/internal/cli/kube"
	"github.com/berth-io/berth/internal/controller/storagecluster"
)

// The hook runs as its own service account (berth-uninstall) with these
// rights only: what it reads to refuse, the release's StorageClusters it
// deletes, the operator it scales, and the node-wide set it removes.
// +kubebuilder:rbac:groups=berth.io,resources=volumes;snapshots;storageclusters,verbs=list
// +kubebuilder:rbac:groups=berth.io,resources=storageclusters,verbs=get;delete
// +kubebuilder:rbac:groups=berth.io,namespace=berth-system,resources=sharemanagers,verbs=list
// +kubebuilder:rbac:groups="",namespace=berth-system,resources=pods,verbs=list
// +kubebuilder:rbac:groups="",resources=nodes,verbs=get
// +kubebuilder:rbac:groups=apps,namespace=berth-system,resources=deployments,verbs=get;list;patch;delete
// +kubebuilder:rbac:groups=apps,namespace=berth-system,resources=daemonsets,verbs=list;delete
// +kubebuilder:rbac:groups="",namespace=berth-system,resources=services,verbs=list;delete
// +kubebuilder:rbac:groups=policy,namespace=berth-system,resources=poddisruptionbudgets,verbs=list;delete
// +kubebuilder:rbac:groups=storage.k8s.io,resources=csidrivers,verbs=get;delete,resourceNames=berth.io

// Config is the command's flags and what it works through.
type Config struct {
	// Namespace is berth's: the operator's and the node-wide set's.
	Namespace string
	// Operator is the operator Deployment's name.
	Operator string
	// Release is the Helm release whose own StorageClusters (the chart's
	// storageCluster.create) are deleted first, as Helm would after the hook.
	Release string
	// Wait bounds each wait: for a StorageCluster's cleanup, for pods to go.
	Wait time.Duration
	// Poll is how often a wait looks (0: every second).
	Poll   time.Duration
	Client client.Client
	Out    io.Writer
}

// ErrInUse: berth still holds data (StorageClusters, Volumes, Snapshots).
var ErrInUse = errors.New("berth is still in use")

// Run removes what the operator deployed, which Helm does not know of, so
// that Helm's removal of berth's service accounts and roles next leaves no
// pod without its rights:
//
//  1. It refuses while a Volume, a Snapshot or a ShareManager is left (the
//     keeper holds every userspace volume's connection, the agent every
//     mount, the CSI controller deletes snapshots), changing nothing.
//  2. It deletes the release's own StorageClusters (the chart's
//     storageCluster.create; Helm would delete them only after this hook)
//     and waits for their cleanup, then refuses while any other is left.
//  3. It scales the operator to 0 (it would deploy the set again), deletes
//     the CSI controller, and checks again that no Volume came meanwhile.
//  4. It deletes the rest of the set and waits for its pods to go.
//
// A failure after step 3 began scales the operator back, which deploys the
// set again. Run again, it finds less to do and says so.
func (c Config) Run(ctx context.Context) error {
	if err := c.refuseData(ctx); err != nil {
		return err
	}
	if err := c.deleteReleaseClusters(ctx); err != nil {
		return err
	}
	if err := c.refuseClusters(ctx); err != nil {
		return err
	}
	replicas, err := c.stopOperator(ctx)
	if err != nil {
		return c.restoreOperator(ctx, replicas, err)
	}
	if err := c.removeNodeWide(ctx); err != nil {
		return c.restoreOperator(ctx, replicas, err)
	}
	c.say("berth's node components are gone; Helm removes the rest")
	return nil
}

// refuseData refuses while berth holds data or a share.
func (c Config) refuseData(ctx context.Context) error {
	var vols v1.VolumeList
	if err := c.Client.List(ctx, &vols); err != nil {
		return fmt.Errorf("list Volumes: %w", err)
	}
	var snaps v1.SnapshotList
	if err := c.Client.List(ctx, &snaps); err != nil {
		return fmt.Errorf("list Snapshots: %w", err)
	}
	var shares v1.ShareManagerList
	if err := c.Client.List(ctx, &shares, client.InNamespace(c.Namespace)); err != nil {
		return fmt.Errorf("list ShareManagers: %w", err)
	}
	if len(vols.Items)+len(snaps.Items)+len(shares.Items) == 0 {
		return nil
	}
	return fmt.Errorf("%w: %d Volume(s), %d Snapshot(s) and %d ShareManager(s) remain. Delete the VolumeSnapshots "+
		"and the claims of berth's volumes, then uninstall again (docs/install.md, Removing berth). Nothing was removed",
		ErrInUse, len(vols.Items), len(snaps.Items), len(shares.Items))
}

// deleteReleaseClusters deletes the StorageClusters the release made and
// waits until their cleanup let them go.
func (c Config) deleteReleaseClusters(ctx context.Context) error {
	var clusters v1.StorageClusterList
	if err := c.Client.List(ctx, &clusters); err != nil {
		return fmt.Errorf("list StorageClusters: %w", err)
	}
	var mine []client.Object
	for i := range clusters.Items {
		sc := &clusters.Items[i]
		if c.Release != "" && sc.Annotations["meta.helm.sh/release-name"] == c.Release &&
			sc.Annotations["meta.helm.sh/release-namespace"] == c.Namespace {
			mine = append(mine, sc)
		}
	}
	for _, sc := range mine {
		if err := c.Client.Delete(ctx, sc); client.IgnoreNotFound(err) != nil {
			return fmt.Errorf("delete StorageCluster %s (the release's): %w", sc.GetName(), err)
		}
		c.say("deleting StorageCluster %s, the release's own; waiting for its cleanup", sc.GetName())
	}
	for _, sc := range mine {
		if err := c.wait(ctx, "StorageCluster "+sc.GetName()+"'s cleanup", func(ctx context.Context) (bool, string, error) {
			err := c.Client.Get(ctx, client.ObjectKeyFromObject(sc), &v1.StorageCluster{})
			if apierrors.IsNotFound(err) {
				return true, "", nil
			}
			return false, "still there", err
		}); err != nil {
			return err
		}
	}
	return nil
}

// refuseClusters refuses while a StorageCluster is left: deleting one is
// its owner's decision (its cleanupPolicy).
func (c Config) refuseClusters(ctx context.Context) error {
	var clusters v1.StorageClusterList
	if err := c.Client.List(ctx, &clusters); err != nil {
		return fmt.Errorf("list StorageClusters: %w", err)
	}
	if len(clusters.Items) == 0 {
		return nil
	}
	names := make([]string, 0, len(clusters.Items))
	for _, sc := range clusters.Items {
		names = append(names, sc.Name)
	}
	slices.Sort(names)
	return fmt.Errorf("%w: StorageCluster(s) %s remain. Delete them (their cleanupPolicy says what happens on "+
		"the nodes), then uninstall again (docs/install.md, Removing berth). Nothing was removed",
		ErrInUse, strings.Join(names, " "))
}

// stopOperator scales the operator to 0 and waits for its pods to go. It
// returns the replicas it had (0: it was not scaled, or is not there).
func (c Config) stopOperator(ctx context.Context) (int32, error) {
	dep := &appsv1.Deployment{}
	err := c.Client.Get(ctx, client.ObjectKey{Namespace: c.Namespace, Name: c.Operator}, dep)
	if apierrors.IsNotFound(err) {
		c.say("no operator Deployment %s/%s", c.Namespace, c.Operator)
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("operator Deployment: %w", err)
	}
	sel, err := operatorSelector(dep)
	if err != nil {
		return 0, err
	}
	var was int32
	if dep.Spec.Replicas == nil || *dep.Spec.Replicas != 0 {
		was = ptr.Deref(dep.Spec.Replicas, 1)
		patch := client.MergeFrom(dep.DeepCopy())
		dep.Spec.Replicas = ptr.To[int32](0)
		if err := c.Client.Patch(ctx, dep, patch); err != nil {
			return 0, fmt.Errorf("scale the operator to 0: %w", err)
		}
		c.say("scaled the operator %s to 0 (from %d), so that it deploys nothing again", c.Operator, was)
	}
	return was, c.waitPodsGone(ctx, "the operator's pods", sel)
}

// restoreOperator scales the operator back to replicas after a failure,
// so that it deploys again whatever was removed; err says what failed.
func (c Config) restoreOperator(ctx context.Context, replicas int32, err error) error {
	if replicas == 0 {
		return err
	}
	dep := &appsv1.Deployment{}
	gerr := c.Client.Get(ctx, client.ObjectKey{Namespace: c.Namespace, Name: c.Operator}, dep)
	if gerr == nil {
		patch := client.MergeFrom(dep.DeepCopy())
		dep.Spec.Replicas = ptr.To(replicas)
		gerr = c.Client.Patch(ctx, dep, patch)
	}
	if gerr != nil {
		return fmt.Errorf("%w; and the operator could not be scaled back to %d (kubectl -n %s scale deployment %s --replicas=%d): %w",
			err, replicas, c.Namespace, c.Operator, replicas, gerr)
	}
	return fmt.Errorf("%w; the operator is scaled back to %d and deploys berth's node components again", err, replicas)
}

// removeNodeWide deletes the CSI controller first (no volume is made
// after it), checks again for data, then deletes the rest of the set and
// waits for its pods and any share-manager pod to go.
func (c Config) removeNodeWide(ctx context.Context) error {
	removed, err := storagecluster.RemoveCSIController(ctx, c.Client, c.Namespace)
	if err != nil {
		return err
	}
	if err := c.waitPodsGone(ctx, "the CSI controller's pods", storagecluster.CSIControllerPods()); err != nil {
		return err
	}
	if err := c.refuseData(ctx); err != nil {
		return fmt.Errorf("a volume came while the uninstall began: %w", err)
	}
	rest, err := storagecluster.RemoveNodeWide(ctx, c.Client, c.Namespace)
	removed = append(removed, rest...)
	if len(removed) > 0 {
		c.say("removed %s", strings.Join(removed, ", "))
	} else {
		c.say("no node-wide set to remove")
	}
	if err != nil {
		return err
	}
	return c.waitPodsGone(ctx, "the agent, keeper and share-manager pods", storagecluster.NodeWidePods())
}

func operatorSelector(dep *appsv1.Deployment) (labels.Selector, error) {
	if dep.Spec.Selector == nil || len(dep.Spec.Selector.MatchLabels) == 0 {
		return nil, fmt.Errorf("operator Deployment %s has no matchLabels selector", dep.Name)
	}
	return labels.SelectorFromSet(dep.Spec.Selector.MatchLabels), nil
}

// waitPodsGone waits until no pod of sel is left in the namespace. A pod
// being deleted on a node that is not Ready counts as gone: its kubelet
// cannot confirm, and it runs nothing that could use berth's rights.
func (c Config) waitPodsGone(ctx context.Context, what string, sel labels.Selector) error {
	return c.wait(ctx, what+" to go", func(ctx context.Context) (bool, string, error) {
		var pods corev1.PodList
		if err := c.Client.List(ctx, &pods, client.InNamespace(c.Namespace), client.MatchingLabelsSelector{Selector: sel}); err != nil {
			return false, "", fmt.Errorf("list pods: %w", err)
		}
		var left []string
		for i := range pods.Items {
			p := &pods.Items[i]
			if p.DeletionTimestamp != nil && !c.nodeReady(ctx, p.Spec.NodeName) {
				continue
			}
			left = append(left, p.Name)
		}
		return len(left) == 0, fmt.Sprintf("%d left: %s", len(left), strings.Join(left, " ")), nil
	})
}

// nodeReady tells whether node exists and is Ready.
func (c Config) nodeReady(ctx context.Context, node string) bool {
	if node == "" {
		return false
	}
	n := &corev1.Node{}
	if err := c.Client.Get(ctx, client.ObjectKey{Name: node}, n); err != nil {
		return !apierrors.IsNotFound(err) // unsure: wait for it
	}
	for _, cond := range n.Status.Conditions {
		if cond.Type == corev1.NodeReady {
			return cond.Status == corev1.ConditionTrue
		}
	}
	return false
}

// wait polls done until it says so, for at most c.Wait; its text says
// what it saw last, for the error.
func (c Config) wait(ctx context.Context, what string, done func(context.Context) (bool, string, error)) error {
	poll := c.Poll
	if poll <= 0 {
		poll = time.Second
	}
	var seen string
	err := wait.PollUntilContextTimeout(ctx, poll, c.Wait, true, func(ctx context.Context) (bool, error) {
		ok, s, err := done(ctx)
		seen = s
		return ok, err
	})
	if err != nil {
		return fmt.Errorf("waiting for %s (%s): %w", what, seen, err)
	}
	return nil
}

func (c Config) say(format string, args ...any) {
	_, _ = fmt.Fprintf(c.Out, "uninstall: "+format+"\n", args...)
}

// Command is `berth uninstall`.
func Command() cli.Command {
	return cli.FlagCommand("uninstall", "remove what the operator deployed, once berth holds no data (the chart's pre-delete hook)",
		func(fs *flag.FlagSet, stdio cli.IO) func(context.Context) error {
			cfg := Config{Out: stdio.Stdout}
			var kf kube.Flags
			kf.Register(fs)
			ns := os.Getenv("POD_NAMESPACE")
			if ns == "" {
				ns = "berth-system"
			}
			fs.StringVar(&cfg.Namespace, "namespace", ns, "berth's namespace (default $POD_NAMESPACE or berth-system)")
			fs.StringVar(&cfg.Operator, "operator", "berth-operator", "the operator Deployment's name")
			fs.StringVar(&cfg.Release, "release", "", "the Helm release whose own StorageClusters are deleted first")
			fs.DurationVar(&cfg.Wait, "wait", 90*time.Second, "how long each wait lasts: a StorageCluster's cleanup, pods to go (Helm waits 5 minutes for the whole hook)")
			return func(ctx context.Context) error {
				c, err := kf.Client()
				if err != nil {
					return err
				}
				cfg.Client = c
				return cfg.Run(ctx)
			}
		})
}
