package dev

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// Namespace holds berth's operator and the pods it deploys.
const Namespace = "berth-system"

// Release is the Helm release `up` installs.
const Release = "berth"

// StorageCluster is the name of the StorageCluster `up` creates.
const StorageCluster = "berth"

// SidecarRegistry is where hack/cluster/images.sh imports the CSI
// sidecars it builds, whatever the berth image's registry.
const SidecarRegistry = "berth.local"

// HelmValues are the chart values for the cluster of env: images imported,
// not pulled; host-network pods reach the API server directly (not through
// the Service network, which comes up with kube-proxy after them); kubelet's
// folders where this cluster keeps them.
func HelmValues(env ClusterEnv) ([]string, error) {
	ref := env["BERTH_IMAGE"]
	slash, colon := strings.LastIndex(ref, "/"), strings.LastIndex(ref, ":")
	if slash <= 0 || colon < slash+2 || colon == len(ref)-1 {
		return nil, fmt.Errorf("cluster.env BERTH_IMAGE %q is not registry/repository:tag: the berth image was not imported", ref)
	}
	registry, repo, tag := ref[:slash], ref[slash+1:colon], ref[colon+1:]
	host, port := env["KUBERNETES_SERVICE_HOST"], env["KUBERNETES_SERVICE_PORT"]
	if host == "" || port == "" {
		return nil, fmt.Errorf("cluster.env lacks KUBERNETES_SERVICE_HOST or KUBERNETES_SERVICE_PORT")
	}
	var args []string
	for _, kv := range [][2]string{
		{"image.registry", registry}, {"image.repository", repo}, {"image.tag", tag}, {"image.pullPolicy", "Never"},
		{"csiSidecars.registry", SidecarRegistry},
		{"apiServer.host", host}, {"apiServer.port", port},
		{"kubeletDir", env["KUBELET_ROOT"]}, {"volumePluginDir", env["VOLUME_PLUGIN_DIR"]},
	} {
		args = append(args, "--set-string", kv[0]+"="+kv[1])
	}
	if pub := publicNAD(env); pub != "" {
		// The test Ceph is on the storage networks only (ceph.sh): the
		// operator joins the public one from the pod network, as the node's
		// own network never reaches Ceph.
		return append(args, "--set-string", "operator.networks="+pub), nil
	}
	return append(args, "--set", "operator.hostNetwork=true"), nil
}

// StorageClusterManifest is the StorageCluster for the cluster of env. Its
// data folder is the one up.sh made a shared mount (under the cluster's
// folder, so that down.sh finds its mounts and loop devices).
func StorageClusterManifest(env ClusterEnv) string {
	return fmt.Sprintf(`apiVersion: berth.io/v1alpha1
kind: StorageCluster
metadata: {name: %s}
spec:
  dataDir: %s
`, StorageCluster, env["BERTH_DATA_DIR"])
}

// ProbeClients is the StorageCluster spec lines that admit the test
// cluster's pod network (and, with multus, its public storage network) to
// every share: these nodes' kernel has no NFS client, so `berth share
// probe` in pods that hold no claim stands in for workload mounts in the
// e2e scenarios. A share admits only its workload nodes otherwise.
func ProbeClients(env ClusterEnv) string {
	var cidrs []string
	for _, k := range []string{"POD_CIDR", "PUBLIC_NET"} {
		if env["MULTUS"] != "1" && k == "PUBLIC_NET" {
			continue
		}
		if v := env[k]; v != "" {
			cidrs = append(cidrs, fmt.Sprintf("%q", v))
		}
	}
	if len(cidrs) == 0 {
		return ""
	}
	return "  rwx:\n    clientCIDRs: [" + strings.Join(cidrs, ", ") + "]\n"
}

// helm finds the pinned helm (`make helm-path` builds it once into bin/).
func (c Config) helm(ctx context.Context) (string, error) {
	cmd := c.Exec.CommandContext(ctx, "make", "-s", "--no-print-directory", "-C", c.Repo, "helm-path")
	var out, errb bytes.Buffer
	cmd.SetStdout(&out)
	cmd.SetStderr(&errb)
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("make helm-path: %w: %s", err, strings.TrimSpace(errb.String()))
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	path := strings.TrimSpace(lines[len(lines)-1])
	if _, err := os.Stat(path); err != nil {
		return "", fmt.Errorf("make helm-path printed %q: %w", path, err)
	}
	return path, nil
}

// runHelm runs helm args against the cluster of env, output on Out.
func (c Config) runHelm(ctx context.Context, helm string, env ClusterEnv, args ...string) error {
	cmd := c.Exec.CommandContext(ctx, helm, args...)
	cmd.SetEnv(append(os.Environ(), "KUBECONFIG="+env["KUBECONFIG"]))
	cmd.SetStdout(c.Out)
	cmd.SetStderr(c.Out)
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("helm %s: %w", strings.Join(args, " "), err)
	}
	return nil
}

// install installs (or upgrades) the chart, waits for the operator, and
// creates the StorageCluster; the operator deploys the rest.
func (c Config) install(ctx context.Context, k kubectl, cephEnv ClusterEnv) error {
	values, err := HelmValues(k.env)
	if err != nil {
		return err
	}
	if c.UnfenceCooldown > 0 {
		values = append(values, "--set-string", "operator.unfenceCooldown="+c.UnfenceCooldown.String(),
			"--set-string", "operator.unfenceInterval="+unfenceInterval(c.UnfenceCooldown).String())
	}
	manifests, err := c.storageClusterManifests(k.env, cephEnv)
	if err != nil {
		return err
	}
	helm, err := c.helm(ctx)
	if err != nil {
		return err
	}
	// Helm installs the chart's CRDs once and never upgrades them: apply
	// them first, as docs/install.md says for an upgrade.
	chart := filepath.Join(c.Repo, "deploy", "berth")
	if _, err := k.run(ctx, nil, "apply", "--server-side", "--force-conflicts", "-f", filepath.Join(chart, "crds")); err != nil {
		return err
	}
	args := append([]string{"upgrade", "--install", Release, chart,
		"-n", Namespace, "--create-namespace"}, values...)
	if err := c.runHelm(ctx, helm, k.env, args...); err != nil {
		return err
	}
	err = c.waitFor(ctx, "operator Deployment available", func(ctx context.Context) (bool, string) {
		out, err := k.run(ctx, nil, "-n", Namespace, "get", "deploy", "-l", "app.kubernetes.io/component=operator",
			"-o", "jsonpath={.items[*].status.readyReplicas}")
		if err != nil {
			return false, err.Error()
		}
		return strings.TrimSpace(out) == "1", "ready replicas " + out
	})
	if err != nil {
		return err
	}
	for _, m := range manifests {
		// kubectl's output names the objects only (a Secret's key stays in).
		if _, err := k.run(ctx, strings.NewReader(m), "apply", "-f", "-"); err != nil {
			return err
		}
	}
	return nil
}

// unfenceInterval is how often the operator's Unfencer looks, for a
// cool-down: often enough that a node is unfenced soon after its cool-down.
func unfenceInterval(cooldown time.Duration) time.Duration {
	return max(cooldown/4, time.Second)
}

// waitDriver waits for the StorageCluster's Ready phase (agents, keepers and
// CSI controller up) and for kubelet to have registered the driver.
func (c Config) waitDriver(ctx context.Context, k kubectl) error {
	for _, sc := range c.storageClusters() {
		err := c.waitFor(ctx, "StorageCluster "+sc+" Ready (agent, keeper, CSI controller, backend)", func(ctx context.Context) (bool, string) {
			out, err := k.run(ctx, nil, "get", "storagecluster", sc, "-o",
				`jsonpath={.status.phase}{range .status.conditions[*]} {.type}={.status}{end}`)
			if err != nil {
				return false, err.Error()
			}
			return strings.HasPrefix(out, "Ready"), "phase " + out
		})
		if err != nil {
			return err
		}
	}
	want := strings.Fields(k.env["NODES"])
	return c.waitFor(ctx, "every node's CSINode lists berth.io", func(ctx context.Context) (bool, string) {
		out, err := k.run(ctx, nil, "get", "csinode", "-o",
			`jsonpath={range .items[*]}{.metadata.name}={.spec.drivers[*].name};{end}`)
		if err != nil {
			return false, err.Error()
		}
		return csiNodesReady(out, want), "drivers: " + out
	})
}

// csiNodesReady tells whether the CSINodes (kubectl's "node=driver ...;"
// list) show berth.io on every node of want, or on one node at least when
// want is empty (a cluster.env of a single-node cluster).
func csiNodesReady(list string, want []string) bool {
	with := map[string]bool{}
	for _, item := range strings.Split(list, ";") {
		node, drivers, _ := strings.Cut(item, "=")
		if slices.Contains(strings.Fields(drivers), "berth.io") {
			with[node] = true
		}
	}
	if len(want) == 0 {
		return len(with) > 0
	}
	for _, n := range want {
		if !with[n] {
			return false
		}
	}
	return true
}

// uninstall deletes the StorageCluster while the agent still runs (its
// cleanup finalizer needs it), then the release. A cleanup that does not
// finish in time is given up, so that down still goes on.
func (c Config) uninstall(ctx context.Context, k kubectl) {
	_, _ = k.run(ctx, nil, "delete", "storagecluster", "--all", "--wait=false")
	err := c.waitFor(ctx, "StorageCluster cleaned up and gone", func(ctx context.Context) (bool, string) {
		out, err := k.run(ctx, nil, "get", "storagecluster", "-o", "jsonpath={.items[*].status.phase}")
		if err != nil {
			return false, err.Error()
		}
		return strings.TrimSpace(out) == "", "phase " + out
	})
	if err != nil {
		c.progress("   %v: dropping the finalizer", err)
		_, _ = k.run(ctx, nil, "patch", "storagecluster", StorageCluster, "--type=merge", "-p", `{"metadata":{"finalizers":null}}`)
	}
	if helm, err := c.helm(ctx); err == nil {
		_ = c.runHelm(ctx, helm, k.env, "uninstall", Release, "-n", Namespace, "--ignore-not-found")
	} else {
		c.progress("   %v", err)
	}
	// Without their controllers the driver pods stay deleted, so down.sh's
	// wait for every pod to go ends at once.
	_, _ = k.run(ctx, nil, "-n", Namespace, "delete", "daemonsets,deployments", "--all", "--wait=false")
}
