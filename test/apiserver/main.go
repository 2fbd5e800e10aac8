// Command apiserver runs a real kube-apiserver + etcd with berth's CRDs
// (internal/testenv) until SIGTERM, and writes a kubeconfig for it, so that
// scripts can run berth's commands as separate processes against it
// (hack/sanity.sh).
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1 "github.com/berth-io/berth/api/v1alpha1"
	"github.com/berth-io/berth/internal/testenv"
	"github.com/berth-io/berth/internal/testenv/testceph"
)

// berthNamespace is where berth's components run.
const berthNamespace = "berth-system"

func main() {
	// Own flag set: controller-runtime registers --kubeconfig on the global one.
	fs := flag.NewFlagSet("apiserver", flag.ExitOnError)
	kubeconfig := fs.String("write-kubeconfig", "", "where to write the kubeconfig")
	node := fs.String("node", "", "create a Node object of this name (envtest has no kubelet)")
	cluster := fs.String("storage-cluster", "", "create a StorageCluster object of this name (the CSI controller makes volumes only for one that exists)")
	dataDir := fs.String("storage-cluster-data-dir", "", "the created StorageCluster's data dir (the agent's --data-dir)")
	class := fs.String("storage-class", "", "create a berth StorageClass of this name for the StorageCluster (the agent publishes capacity per class, the CSI controller places volumes by it)")
	cephCluster := fs.String("ceph-storage-cluster", "", "create a ceph StorageCluster of this name, and its Secret in berth-system, on the test Ceph of --ceph-env")
	cephEnv := fs.String("ceph-env", "", "the env file hack/ceph/up.sh printed (monitors, pool, the client and its keyring)")
	_ = fs.Parse(os.Args[1:])
	if *kubeconfig == "" {
		fmt.Fprintln(os.Stderr, "apiserver: --write-kubeconfig is required")
		os.Exit(2)
	}
	env, err := testenv.Start()
	if err != nil {
		fmt.Fprintln(os.Stderr, "apiserver:", err)
		os.Exit(1)
	}
	code := 0
	err = env.WriteKubeconfig(*kubeconfig)
	if err == nil && *node != "" {
		err = env.Client.Create(context.Background(), &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: *node}})
	}
	if err == nil && *cluster != "" {
		err = env.Client.Create(context.Background(), &v1.StorageCluster{ObjectMeta: metav1.ObjectMeta{Name: *cluster},
			Spec: v1.StorageClusterSpec{DataDir: *dataDir}})
	}
	if err == nil && (*class != "" || *cephCluster != "") {
		// The agents publish the class's capacity in berth's namespace; the
		// ceph StorageCluster's Secret lives there.
		err = env.Client.Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: berthNamespace}})
	}
	if err == nil && *cephCluster != "" {
		var ceph *testceph.Cluster
		if ceph, err = testceph.Load(*cephEnv); err == nil {
			err = ceph.MakeStorageCluster(context.Background(), env.Client, *cephCluster, berthNamespace, *dataDir)
		}
	}
	if err == nil && *class != "" {
		err = env.Client.Create(context.Background(), &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: *class},
			Provisioner: v1.DriverName, Parameters: map[string]string{v1.ParamStorageCluster: *cluster}})
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "apiserver:", err)
		code = 1
	} else {
		fmt.Println("apiserver: ready, kubeconfig at", *kubeconfig)
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
		<-ctx.Done()
		stop()
	}
	if err := env.Stop(); err != nil {
		fmt.Fprintln(os.Stderr, "apiserver: stop:", err)
	}
	os.Exit(code)
}
