// Package e2e runs berth's end-to-end tests against the real Kubernetes of
// hack/cluster (the control plane in the hub network namespace, and per node
// a containerd and a kubelet in the node's own network and mount
// namespaces; two nodes with `make e2e`). Scenarios that need a second node
// skip on one. A node's mounts and files live in its mount namespace
// (Env.NodeMounts, Env.NodePath); Env.NodeAction stops, freezes or cuts off
// a node (hack/cluster/node.sh). Run them with `make e2e` (hack/e2e.sh: up,
// test, down), or against a cluster already up:
//
//	BERTH_E2E_NODES=2 hack/cluster/up.sh && go test -tags e2e -count=1 -v ./test/e2e/...
//
// The scenarios are subtests of TestE2E, in the order of the one list in
// scenarios_test.go (not by file name); run one with
// `-run 'TestE2E/NodeLossAndReturn$'` (the function's name without "test"),
// e.g. `hack/e2e.sh -run 'TestE2E/SnapshotRestore$'`. TestScenarioList (no
// cluster needed) fails on a scenario missing from the list.
//
// BERTH_E2E_ENV names the cluster.env that up.sh wrote (default
// /var/lib/berth-e2e/cluster.env); BERTH_E2E_UP=1 makes TestMain bring the
// cluster up and down itself.
package e2e
