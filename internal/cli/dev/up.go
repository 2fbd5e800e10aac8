package dev

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// Demo objects `up` creates.
const (
	DemoNamespace = "berth-demo"
	DemoPVC       = "demo-data"
	DemoPod       = "demo-writer"
	DemoText      = "hello from berth"
)

// up brings up the cluster, installs berth, and (with Demo) runs a pod that
// writes to a berth volume. Every step finds what a previous run made.
func (c Config) up(ctx context.Context) error {
	if err := c.check(); err != nil {
		return err
	}
	start := time.Now()
	c.progress("1/4 cluster: hack/cluster/up.sh (kube binaries and CSI sidecars are cached after the first run)")
	env := []string{"BERTH_E2E_BERTH_BINARY=" + c.BerthBinary, "BERTH_E2E_SIDECARS=1"}
	if c.Nodes > 0 {
		env = append(env, fmt.Sprintf("BERTH_E2E_NODES=%d", c.Nodes))
	}
	if c.VMNodes > 0 {
		env = append(env, fmt.Sprintf("BERTH_E2E_VM_NODES=%d", c.VMNodes))
	}
	if c.Multus {
		env = append(env, "BERTH_E2E_MULTUS=1")
	}
	if err := c.runScript(ctx, "up.sh", env...); err != nil {
		return err
	}
	cenv, err := LoadClusterEnv(filepath.Join(c.WorkDir, "cluster.env"))
	if err != nil {
		return err
	}
	k := kubectl{cfg: c, env: cenv}
	var cephEnv ClusterEnv
	if c.needsCeph() {
		c.progress("   the test Ceph in the cluster's network: hack/cluster/ceph.sh up (1 mon, 1 mgr, 3 OSDs)")
		if cephEnv, err = c.cephUp(ctx); err != nil {
			return err
		}
	}
	c.progress("2/4 installing berth: Helm chart deploy/berth (CRDs, operator), then StorageCluster(s) %s (backend %s)",
		strings.Join(c.storageClusters(), ", "), c.Backend)
	uncordon, err := c.cordonVMNodes(ctx, k, cenv)
	if err != nil {
		return err
	}
	err = c.install(ctx, k, cephEnv)
	if err == nil {
		c.progress("3/4 waiting for the operator to deploy the agent, keeper and CSI controller")
		if err = c.waitDriver(ctx, k); err != nil {
			c.dumpDriver(ctx, k)
		}
	}
	if uerr := uncordon(); err == nil {
		err = uerr
	}
	if err != nil {
		return err
	}
	if c.Demo {
		c.progress("4/4 demo: PVC %s/%s and pod %s writing to it", DemoNamespace, DemoPVC, DemoPod)
		if err := c.demo(ctx, k); err != nil {
			_, _ = k.run(ctx, nil, "-n", DemoNamespace, "describe", "pvc,pod")
			return err
		}
		c.progress("pod with a berth volume Running, data written: %q", DemoText)
	}
	c.progress("up in %s", time.Since(start).Round(time.Second))
	c.lookAround(cenv)
	return nil
}

// runScript runs hack/cluster/NAME with extra environment, output on Out.
func (c Config) runScript(ctx context.Context, name string, env ...string) error {
	return c.runScriptArgs(ctx, name, nil, env...)
}

// runScriptArgs runs hack/cluster/NAME with args and extra environment.
func (c Config) runScriptArgs(ctx context.Context, name string, args []string, env ...string) error {
	cmd := c.Exec.CommandContext(ctx, c.script(name), args...)
	cmd.SetEnv(append(append(os.Environ(), "BERTH_E2E_DIR="+c.WorkDir), env...))
	cmd.SetStdout(c.Out)
	cmd.SetStderr(c.Out)
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("hack/cluster/%s: %w", name, err)
	}
	return nil
}

// dumpDriver prints what helps when the driver does not come up.
func (c Config) dumpDriver(ctx context.Context, k kubectl) {
	out, _ := k.run(ctx, nil, "-n", Namespace, "get", "pods,events", "-o", "wide")
	fmt.Fprintln(c.Out, out)
	out, _ = k.run(ctx, nil, "-n", Namespace, "logs", "--all-containers", "--tail=40", "-l", "app.kubernetes.io/name=berth")
	fmt.Fprintln(c.Out, out)
}

const demoManifest = `apiVersion: v1
kind: Namespace
metadata: {name: %[1]s}
---
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: %[2]s, namespace: %[1]s}
spec:
  accessModes: [ReadWriteOnce]
  storageClassName: %[6]s
  resources: {requests: {storage: 256Mi}}
---
apiVersion: v1
kind: Pod
metadata: {name: %[3]s, namespace: %[1]s}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: writer
    image: %[4]s
    imagePullPolicy: Never
    command: [sh, -c, 'echo "%[5]s" > /data/hello && sync && cat /data/hello && exec sleep 2147483647']
    volumeMounts: [{name: data, mountPath: /data}]
  volumes:
  - {name: data, persistentVolumeClaim: {claimName: %[2]s}}
`

func (c Config) demo(ctx context.Context, k kubectl) error {
	m := fmt.Sprintf(demoManifest, DemoNamespace, DemoPVC, DemoPod, k.env["BUSYBOX_IMAGE"], DemoText, c.demoClass())
	if _, err := k.run(ctx, strings.NewReader(m), "apply", "-f", "-"); err != nil {
		return err
	}
	err := c.waitFor(ctx, "demo PVC bound and pod Running", func(ctx context.Context) (bool, string) {
		pvc, err := k.run(ctx, nil, "-n", DemoNamespace, "get", "pvc", DemoPVC, "-o", "jsonpath={.status.phase}")
		if err != nil {
			return false, err.Error()
		}
		pod, err := k.run(ctx, nil, "-n", DemoNamespace, "get", "pod", DemoPod, "-o", "jsonpath={.status.phase}")
		if err != nil {
			return false, err.Error()
		}
		return pvc == "Bound" && pod == "Running", "PVC " + pvc + ", pod " + pod
	})
	if err != nil {
		return err
	}
	var got string
	err = c.waitFor(ctx, "the pod's data", func(ctx context.Context) (bool, string) {
		got, err = k.run(ctx, nil, "-n", DemoNamespace, "exec", DemoPod, "--", "cat", "/data/hello")
		if err != nil {
			return false, err.Error()
		}
		return strings.TrimSpace(got) == DemoText, "read " + strings.TrimSpace(got)
	})
	return err
}

// demoClass is the demo claim's class: the userspace one on Ceph (the
// kernel mounter needs krbd, which test kernels lack).
func (c Config) demoClass() string {
	if c.Backend == BackendCeph {
		return StorageCluster + "-userspace"
	}
	return StorageCluster
}

// lookAround prints the commands to look at what up made.
func (c Config) lookAround(env ClusterEnv) {
	fmt.Fprintf(c.Out, `
Look around (the API server is reachable from this host at %s):

  export KUBECONFIG=%s
  alias kubectl=%s
  kubectl get storageclusters,volumes,attachments
  kubectl get storageclass,pv
  kubectl -n %s get pvc,pods
  kubectl -n %s exec %s -- cat /data/hello
  kubectl -n %s get pods -o wide; kubectl -n %s logs ds/berth-agent

Remove everything:  berth dev down --repo %s   (or: make dev-down)
`, env["API_SERVER"], env["KUBECONFIG"], env["KUBECTL"], DemoNamespace, DemoNamespace, DemoPod,
		Namespace, Namespace, c.Repo)
}

// cordonVMNodes keeps berth's Deployments (operator, CSI controller) off
// the VM nodes while berth is installed, when a netns node can run them:
// a VM node has no sidecar images (hack/cluster/images.sh), and its
// PreferNoSchedule taint alone once lost to the scheduler's other scores
// (the CSI controller stuck in ErrImageNeverPull). DaemonSet pods run on
// cordoned nodes. The returned func uncordons them.
func (c Config) cordonVMNodes(ctx context.Context, k kubectl, env ClusterEnv) (func() error, error) {
	var vms []string
	netns := 0
	for i := 1; env[fmt.Sprintf("NODE_NAME_%d", i)] != ""; i++ {
		if env[fmt.Sprintf("NODE_KIND_%d", i)] == "vm" {
			vms = append(vms, env[fmt.Sprintf("NODE_NAME_%d", i)])
		} else {
			netns++
		}
	}
	if len(vms) == 0 || netns == 0 {
		return func() error { return nil }, nil
	}
	if _, err := k.run(ctx, nil, append([]string{"cordon"}, vms...)...); err != nil {
		return nil, fmt.Errorf("cordon the VM nodes while berth is installed: %w", err)
	}
	return func() error {
		if _, err := k.run(context.WithoutCancel(ctx), nil, append([]string{"uncordon"}, vms...)...); err != nil {
			return fmt.Errorf("uncordon the VM nodes after berth's install: %w", err)
		}
		return nil
	}, nil
}
