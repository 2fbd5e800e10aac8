#!/usr/bin/env bash
# The test command of the README (`make test`): installs what the tests need,
# builds or reuses the cached kube-apiserver + etcd, runs every Go test, and
# closes with one line "N passed, M failed, K skipped".
#   hack/test.sh [go test flags...]
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="/usr/local/go/bin:$PATH"

start=$SECONDS
hack/install-deps.sh
KUBEBUILDER_ASSETS=$(hack/kube-binaries.sh | tail -n 1)
export KUBEBUILDER_ASSETS
# The chart tests (deploy/) run the pinned helm, built once into bin/.
make --no-print-directory -s helm >&2
echo "test: setup done in $((SECONDS - start))s (KUBEBUILDER_ASSETS=$KUBEBUILDER_ASSETS)"

log=$(mktemp)
trap 'rm -f "$log"' EXIT
rc=0
# The default build has the ceph backend (cgo against Debian's librbd and
# librados, build tags ceph,pacific), so every test runs tagged, and the
# tests that build bin/berth (testenv.BuildBerth) build it that way too.
# BERTH_CEPH=0 tests the build without Ceph (`make build CEPH=0`) and leaves
# the tests on a real Ceph out.
if [ "${BERTH_CEPH:-1}" != 0 ] && ! hack/install-deps.sh --ceph-build; then
	if [ "$(id -u)" -eq 0 ]; then
		echo "--- FAIL: the ceph build: gcc/librbd-dev/librados-dev could not be installed" | tee -a "$log"
		rc=1
	fi
	echo "test: testing the build without Ceph (BERTH_CEPH=0): its libraries are missing"
	export BERTH_CEPH=0
fi
tags=(-tags ceph,pacific)
[ "${BERTH_CEPH:-1}" = 0 ] && tags=()
# -p 1: packages that start API servers or touch loop devices run one at a
# time on our 2-core machines. As root this includes the tests on a real
# Ceph (internal/testenv/testceph: ~20-45 s to start one per package that
# uses one, plus ~50 s once to install Debian's ceph packages), among them
# csi-sanity on a ceph class in test/sanity (~80 s more than the local
# classes' suites).
set +e
go test "${tags[@]}" -p 1 -count=1 -timeout 30m -v "$@" ./... 2>&1 | tee -a "$log" | grep -vE '^=== (RUN|PAUSE|CONT)'
r=${PIPESTATUS[0]}
[ "$r" -eq 0 ] || rc=$r

# The build without Ceph (`make build CEPH=0`) keeps working: its own tests
# (what a ceph StorageCluster gets from a binary without the backend) run
# untagged and static.
if [ ${#tags[@]} -gt 0 ]; then
	CGO_ENABLED=0 go test -p 1 -count=1 -timeout 10m -v -run 'WithoutTheTag|CephNotBuilt|WithoutCephBuild' "$@" \
		./internal/backend/ceph/ ./internal/blockdev/rbdimage/ ./internal/controller/storagecluster/ ./internal/csi/ 2>&1 | tee -a "$log" | grep -vE '^=== (RUN|PAUSE|CONT)'
	r=${PIPESTATUS[0]}
	[ "$r" -eq 0 ] || rc=$r
fi
set -e

# In CI every fuzz target also runs a few seconds beyond its seed corpus
# (which the go test run above already ran).
if [ "${CI:-}" = true ]; then
	set +e
	FUZZTIME=3s hack/fuzz.sh 2>&1 | tee -a "$log"
	fuzz=${PIPESTATUS[0]}
	set -e
	[ "$fuzz" -eq 0 ] || rc=$fuzz
fi

# In CI (CI=true, as root) the end-to-end scenarios (a two-node cluster) and
# then the CI subset of the Kubernetes storage conformance suite
# (CONFORMANCE_QUICK=1) run too, each when the rest of CI's budget
# (BERTH_CI_BUDGET_SECONDS, 90 min) still fits it: their time with the cache
# (~/.cache/berth) plus what a cold cache adds (kube binaries, CSI sidecars,
# snapshot-controller, CoreDNS, e2e.test). BERTH_E2E=0 / BERTH_CONFORMANCE=0
# leave them out. The e2e run includes the Ceph scenarios on a test Ceph in
# the cluster's network (~4 min of its ~16; BERTH_E2E_CEPH=0 leaves them out);
# so does the conformance subset (class berth-ceph-userspace; a build
# without Ceph skips it, saying why).
# Last, with what budget is left, the two multus restart scenarios in a
# cluster of their own (BERTH_E2E_MULTUS_CI=0 leaves them out).
cache="${BERTH_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/berth}"
kube="$cache/kube-v1.34.4-etcd-v3.6.5"
# budget_left: seconds of CI's budget not yet spent.
budget_left() { echo $((${BERTH_CI_BUDGET_SECONDS:-5400} - (SECONDS - start))); }
# cold SECONDS FILE...: SECONDS when any FILE is missing, else 0.
cold() {
	local s=$1 f
	shift
	for f in "$@"; do [ -x "$f" ] || { echo "$s"; return; }; done
	echo 0
}
# in_ci NAME NEED CMD...: runs CMD (output into the log) when CI's budget
# still fits NEED seconds; says so either way.
in_ci() {
	local name=$1 need=$2 left
	shift 2
	left=$(budget_left)
	if [ "$left" -le "$need" ]; then
		echo "test: $name left out: it needs about ${need}s, ${left}s of CI's budget left"
		return 0
	fi
	echo "test: running $name (about ${need}s; ${left}s of CI's budget left)"
	local r
	set +e
	"$@" 2>&1 | tee -a "$log" | grep -vE '^=== (RUN|PAUSE|CONT)'
	r=${PIPESTATUS[0]}
	set -e
	[ "$r" -eq 0 ] || rc=$r
}
if [ "${CI:-}" = true ] && [ "$(id -u)" -eq 0 ]; then
	make --no-print-directory -s build
	if [ "${BERTH_E2E:-1}" != 0 ]; then
		# Cold parts, measured on a fresh 2-core machine (CI run 17), where the
		# setup's kube-apiserver build leaves Go's build cache warm: kubectl,
		# controller-manager, scheduler, kubelet, kube-proxy 74 s in all;
		# CSI sidecars 174 s; CoreDNS 73 s; the bring-up 439 s against ~120 s
		# warm. The numbers below leave room for a cold Go cache (kubelet
		# ~3 min alone); the old 2400 s left e2e out of every fresh machine.
		need=$((1240 + $(cold 600 "$kube/kubelet" "$kube/kube-proxy") +
			$(cold 300 "$cache/csi-sidecars/csi-resizer-v1.14.0" "$cache/csi-sidecars/snapshot-controller-v8.3.0") +
			$(cold 150 "$cache/coredns/coredns-v1.12.4")))
		in_ci "the e2e scenarios (two nodes)" "$need" hack/e2e.sh
	fi
	if [ "${BERTH_CONFORMANCE:-1}" != 0 ]; then
		# ~8 min for berth and berth-userspace, ~3 more for berth-ceph-userspace
		# (the test Ceph's boot and its six specs)
		# e2e.test, agnhost, ginkgo: 145 s cold in CI run 17 (the whole subset
		# took 809 s there, cold cluster included, e2e having been left out).
		need=$((660 + $(cold 300 "$kube/e2e.test" "$kube/agnhost" "$kube/ginkgo")))
		CONFORMANCE_QUICK=1 in_ci "the conformance CI subset" "$need" hack/conformance.sh
	fi
	if [ "${BERTH_E2E:-1}" != 0 ] && [ "${BERTH_E2E_MULTUS_CI:-1}" != 0 ]; then
		# Last, so only budget the runs above left: the two multus restart
		# scenarios in a bring-up of their own (BERTH_E2E_MULTUS=1: multus,
		# whereabouts, the test Ceph on the storage networks only). A warm
		# run took 793 s here (bring-up, 143 s of tests, down, on two busy
		# cores); a cold cache builds multus and whereabouts (~2 min here)
		# on top of the e2e cluster's own builds.
		need=$((800 + $(cold 300 "$cache/cni-plugins/multus-v4.2.2" "$cache/cni-plugins/whereabouts-v0.8.0") +
			$(cold 600 "$kube/kubelet" "$kube/kube-proxy") + $(cold 300 "$cache/csi-sidecars/csi-resizer-v1.14.0")))
		BERTH_E2E_MULTUS=1 in_ci "the multus e2e scenarios" "$need" \
			hack/e2e.sh -run 'TestE2E/(MultusMoverAgentRestarts|MultusNetnsAgentRestarts)$'
	fi
fi

passed=$(grep -cE '^\s*--- PASS' "$log" || true)
failed=$(grep -cE '^\s*--- FAIL' "$log" || true)
skipped=$(grep -cE '^\s*--- SKIP' "$log" || true)
if [ "$rc" -ne 0 ] && [ "$failed" -eq 0 ]; then
	# A build failure or a crash in TestMain fails a package without a test line.
	grep -E '^(FAIL|#|.*\.go:[0-9]+:[0-9]+:)' "$log" | head -40 >&2 || true
	failed=1
fi
echo "test: finished in $((SECONDS - start))s"
echo "$passed passed, $failed failed, $skipped skipped"
exit "$rc"
