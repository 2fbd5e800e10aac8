package dev

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// down removes the demo, then berth, then the whole cluster, and checks that
// nothing is left (hack/cluster/leftovers.sh). Consumer pods go before the
// driver so that kubelet can still unmount their volumes.
func (c Config) down(ctx context.Context) error {
	if err := c.check(); err != nil {
		return err
	}
	start := time.Now()
	env, err := LoadClusterEnv(filepath.Join(c.WorkDir, "cluster.env"))
	switch {
	case err == nil:
		k := kubectl{cfg: c, env: env}
		if _, err := k.run(ctx, nil, "get", "--raw", "/readyz"); err == nil {
			c.progress("1/3 deleting the demo and every volume consumer (the driver still runs to unmount)")
			c.deleteConsumers(ctx, k)
			c.progress("   deleting the StorageCluster (the agent cleans the node), then helm uninstall")
			c.uninstall(ctx, k)
		}
	case errors.Is(err, os.ErrNotExist):
		c.progress("no cluster.env in %s: only cleaning up", c.WorkDir)
	default:
		c.progress("ignoring %v: only cleaning up", err)
	}
	c.progress("2/3 hack/cluster/down.sh")
	if err := c.runScript(ctx, "down.sh"); err != nil {
		return err
	}
	c.progress("3/3 hack/cluster/leftovers.sh")
	if err := c.runScript(ctx, "leftovers.sh"); err != nil {
		return err
	}
	c.progress("down in %s: no process, mount, loop device, namespace or interface left", time.Since(start).Round(time.Second))
	return nil
}

func (c Config) deleteConsumers(ctx context.Context, k kubectl) {
	_, _ = k.run(ctx, nil, "delete", "namespace", DemoNamespace, "--ignore-not-found", "--wait=false")
	// A node whose kubelet is gone (a VM test node that died) never
	// confirms its pods gone nor unmounts: its pods are removed from the
	// API at once, and its volumes are not waited for; down.sh stops the
	// node and the leftovers check still looks at what it left.
	lost := map[string]string{}
	if out, err := k.run(ctx, nil, "get", "nodes", "-o", "json"); err == nil {
		if l, err := lostNodes([]byte(out)); err == nil {
			lost = l
		}
	}
	for _, name := range slices.Sorted(maps.Keys(lost)) {
		c.progress("   node %s is not Ready (%s): its pods are force-deleted, its volumes not waited for", name, lost[name])
	}
	_ = c.waitFor(ctx, "consumer pods gone", func(ctx context.Context) (bool, string) {
		out, err := k.run(ctx, nil, "get", "pods", "-A", "-o", "json")
		if err != nil {
			return false, err.Error()
		}
		pods, stranded, err := consumers([]byte(out), lost)
		if err != nil {
			return false, err.Error()
		}
		if len(pods) == 0 {
			return true, ""
		}
		left := ""
		for _, ns := range slices.Sorted(maps.Keys(pods)) {
			names := pods[ns]
			_, _ = k.run(ctx, nil, append([]string{"-n", ns, "delete", "pods", "--ignore-not-found", "--wait=false", "--grace-period=5"}, names...)...)
			if s := stranded[ns]; len(s) > 0 {
				_, _ = k.run(ctx, nil, append([]string{"-n", ns, "delete", "pods", "--ignore-not-found", "--wait=false", "--force", "--grace-period=0"}, s...)...)
			}
			left += fmt.Sprintf(" %s/%s", ns, strings.Join(names, ","))
		}
		return false, "left:" + left
	})
	// PVs with reclaim Delete go while the controller still runs. Those
	// on a lost node cannot: the wait is short then.
	_, _ = k.run(ctx, nil, "delete", "pvc", "-A", "--all", "--wait=false")
	pvCtx := ctx
	if len(lost) > 0 {
		var cancel context.CancelFunc
		pvCtx, cancel = context.WithTimeout(ctx, lostNodePVWait)
		defer cancel()
	}
	_ = c.waitFor(pvCtx, "berth volumes deleted", func(ctx context.Context) (bool, string) {
		out, err := k.run(ctx, nil, "get", "pv", "-o", "name")
		if err != nil {
			return false, err.Error()
		}
		return out == "", "left: " + out
	})
}

// lostNodePVWait bounds the wait for PVs to go while a node is lost: the
// volumes elsewhere go in seconds, those on the lost node never.
const lostNodePVWait = 30 * time.Second
