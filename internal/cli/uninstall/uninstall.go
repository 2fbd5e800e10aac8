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

// Config is the command's flags and what it works through.
type Config struct {
	// Namespace is berth's: the operator's and the node-wide set's.
	Namespace string
	// Operator is the operator Deployment's name.
	Operator string
	// Wait bounds each wait for pods to go.
	Wait time.Duration
	// Poll is how often a wait looks (0: every second).
	Poll   time.Duration
	Client client.Client
	Out    io.Writer
}

// ErrInUse: berth still has StorageClusters or Volumes; nothing was removed.
var ErrInUse = errors.New("berth is still in use")

// Run refuses while a StorageCluster, a Volume or a Snapshot exists (the
// keeper holds every userspace volume's connection, the agent every mount,
// the CSI controller deletes snapshots), then stops the operator (it would deploy the set again), removes the node-wide set
// and waits for its pods to go, so that Helm's removal of berth's service
// accounts and roles next leaves no pod without its rights. Run again, it
// finds less to do and says so.
func (c Config) Run(ctx context.Context) error {
	if err := c.refuseInUse(ctx); err != nil {
		return err
	}
	if err := c.stopOperator(ctx); err != nil {
		return err
	}
	removed, err := storagecluster.RemoveNodeWide(ctx, c.Client, c.Namespace)
	if len(removed) > 0 {
		c.say("removed %s", strings.Join(removed, ", "))
	} else {
		c.say("no node-wide set to remove")
	}
	if err != nil {
		return err
	}
	if err := c.waitPodsGone(ctx, "the agent, keeper and CSI controller pods", storagecluster.NodeWidePods()); err != nil {
		return err
	}
	c.say("berth's node components are gone; Helm removes the rest")
	return nil
}

func (c Config) refuseInUse(ctx context.Context) error {
	var clusters v1.StorageClusterList
	if err := c.Client.List(ctx, &clusters); err != nil {
		return fmt.Errorf("list StorageClusters: %w", err)
	}
	var vols v1.VolumeList
	if err := c.Client.List(ctx, &vols); err != nil {
		return fmt.Errorf("list Volumes: %w", err)
	}
	// A snapshot's content is deleted through the CSI controller.
	var snaps v1.SnapshotList
	if err := c.Client.List(ctx, &snaps); err != nil {
		return fmt.Errorf("list Snapshots: %w", err)
	}
	if len(clusters.Items) == 0 && len(vols.Items) == 0 && len(snaps.Items) == 0 {
		return nil
	}
	names := make([]string, 0, len(clusters.Items))
	for _, sc := range clusters.Items {
		names = append(names, sc.Name)
	}
	slices.Sort(names)
	return fmt.Errorf("%w: %d StorageCluster(s) [%s], %d Volume(s) and %d Snapshot(s) remain. Delete the claims "+
		"of berth's volumes and their VolumeSnapshots, then the StorageClusters (their cleanupPolicy says what "+
		"happens on the nodes), then uninstall again (docs/install.md, Removing berth). Nothing was removed",
		ErrInUse, len(names), strings.Join(names, " "), len(vols.Items), len(snaps.Items))
}

// stopOperator scales the operator to 0 and waits for its pods to go.
func (c Config) stopOperator(ctx context.Context) error {
	dep := &appsv1.Deployment{}
	err := c.Client.Get(ctx, client.ObjectKey{Namespace: c.Namespace, Name: c.Operator}, dep)
	if apierrors.IsNotFound(err) {
		c.say("no operator Deployment %s/%s", c.Namespace, c.Operator)
		return nil
	}
	if err != nil {
		return fmt.Errorf("operator Deployment: %w", err)
	}
	if dep.Spec.Replicas == nil || *dep.Spec.Replicas != 0 {
		patch := client.MergeFrom(dep.DeepCopy())
		dep.Spec.Replicas = ptr.To[int32](0)
		if err := c.Client.Patch(ctx, dep, patch); err != nil {
			return fmt.Errorf("scale the operator to 0: %w", err)
		}
		c.say("scaled the operator %s to 0, so that it deploys nothing again", c.Operator)
	}
	sel, err := operatorSelector(dep)
	if err != nil {
		return err
	}
	return c.waitPodsGone(ctx, "the operator's pods", sel)
}

func operatorSelector(dep *appsv1.Deployment) (labels.Selector, error) {
	if dep.Spec.Selector == nil || len(dep.Spec.Selector.MatchLabels) == 0 {
		return nil, fmt.Errorf("operator Deployment %s has no matchLabels selector", dep.Name)
	}
	return labels.SelectorFromSet(dep.Spec.Selector.MatchLabels), nil
}

// waitPodsGone waits until no pod of sel is left in the namespace.
func (c Config) waitPodsGone(ctx context.Context, what string, sel labels.Selector) error {
	poll := c.Poll
	if poll <= 0 {
		poll = time.Second
	}
	var left []string
	err := wait.PollUntilContextTimeout(ctx, poll, c.Wait, true, func(ctx context.Context) (bool, error) {
		var pods corev1.PodList
		if err := c.Client.List(ctx, &pods, client.InNamespace(c.Namespace), client.MatchingLabelsSelector{Selector: sel}); err != nil {
			return false, fmt.Errorf("list pods: %w", err)
		}
		left = left[:0]
		for _, p := range pods.Items {
			left = append(left, p.Name)
		}
		return len(left) == 0, nil
	})
	if err != nil {
		return fmt.Errorf("waiting for %s to go (%d left: %s): %w", what, len(left), strings.Join(left, " "), err)
	}
	return nil
}

func (c Config) say(format string, args ...any) {
	_, _ = fmt.Fprintf(c.Out, "uninstall: "+format+"\n", args...)
}

// Command is `berth uninstall`.
func Command() cli.Command {
	return cli.FlagCommand("uninstall", "remove what the operator deployed, once no StorageCluster or Volume is left (the chart's pre-delete hook)",
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
			fs.DurationVar(&cfg.Wait, "wait", 3*time.Minute, "how long to wait for each set of pods to go")
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
