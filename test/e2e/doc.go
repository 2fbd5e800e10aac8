// Package e2e runs berth's end-to-end tests against the real single-node
// Kubernetes of hack/cluster (etcd, kube-apiserver, controller-manager,
// scheduler, containerd and kubelet inside the network namespace the script
// makes). Run them with `make e2e` (hack/e2e.sh: up, test, down), or against
// a cluster already up:
//
//	hack/cluster/up.sh && go test -tags e2e -count=1 -v ./test/e2e/...
//
// BERTH_E2E_ENV names the cluster.env that up.sh wrote (default
// /var/lib/berth-e2e/cluster.env); BERTH_E2E_UP=1 makes TestMain bring the
// cluster up and down itself.
package e2e
