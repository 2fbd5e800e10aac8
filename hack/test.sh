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
# envtest waits 20 s for its kube-apiserver by default; on a busy 2-core
# machine (the Go tests at nice 5 beside a VM node, below) a start can take
# longer, which is no failure of the test.
export KUBEBUILDER_CONTROLPLANE_START_TIMEOUT="${KUBEBUILDER_CONTROLPLANE_START_TIMEOUT:-120s}"
# The chart tests (deploy/) run the pinned helm, built once into bin/.
make --no-print-directory -s helm >&2
echo "test: setup done in $((SECONDS - start))s (KUBEBUILDER_ASSETS=$KUBEBUILDER_ASSETS)"

log=$(mktemp)
prebuild_pid=
trap '[ -z "$prebuild_pid" ] || kill "$prebuild_pid" 2>/dev/null; rm -f "$log" "$log.prebuild" "$log.prebuild-others" "$log.vmrc"' EXIT
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

ci=
[ "${CI:-}" = true ] && [ "$(id -u)" -eq 0 ] && ci=1
# Each tier's name, time and exit code, for the table at the end.
tiers=()
# tier NAME CMD...: runs CMD (its output into the log too), records its time
# and exit code; a failure fails the run but the next tier still runs.
tier() {
	local name=$1 s=$SECONDS r
	shift
	echo "test: tier $name: starting at $((SECONDS - start))s"
	set +e
	"$@" 2>&1 | tee -a "$log" | grep -vE '^=== (RUN|PAUSE|CONT)'
	r=${PIPESTATUS[0]}
	set -e
	[ "$r" -eq 0 ] || rc=$r
	tiers+=("$(printf '%-28s %6ss  exit %s' "$name" "$((SECONDS - s))" "$r")")
	echo "test: tier $name: exit $r in $((SECONDS - s))s"
}
# left_out NAME WHY: a tier that does not run says so, in the table too.
left_out() {
	echo "test: tier $1: left out: $2"
	tiers+=("$(printf '%-28s %7s  left out: %s' "$1" "-" "$2")")
}

# In CI the cluster tiers' binaries (kubelet, the e2e suite, sidecars,
# CoreDNS, multus, the VM image) build while the Go tests run one package
# at a time (hack/prebuild.sh): what the VM tier needs at their priority,
# the rest at the lowest; the cluster tiers wait for it.
#
# The VM scenarios (kernel NFS client, nbd, a real power-off: hack/vm,
# qemu under TCG) then run beside the Go tests, in a cluster of their own
# (one netns node and one VM node): ~30 minutes that would otherwise come
# on top of the other cluster tiers. They share nothing with the Go tests:
# the cluster lives in its own network namespaces and under
# /var/lib/berth-e2e and /run/berth, which no Go test touches, and its
# leftovers check looks only there. The other cluster tiers start once it
# is down: one cluster at a time. BERTH_E2E_VM_CI=0 leaves it out, saying so.
vm_tier=
if [ -n "$ci" ] && [ "${BERTH_E2E:-1}" != 0 ]; then
	[ "${BERTH_E2E_VM_CI:-1}" = 1 ] && vm_tier=1
	make --no-print-directory -s build
	(
		set +e
		if [ -n "$vm_tier" ]; then
			# What the VM tier's cluster needs first, at the Go tests'
			# priority: the VM tier is the run's longest lane, and on a cold
			# machine its builds at nice 19 took 1514 s beside the Go tests
			# (kube-controller-manager alone 683 s). The rest builds while
			# that tier runs (qemu, at normal priority, comes first).
			hack/prebuild.sh vm
			nice -n 19 hack/prebuild.sh others >"$log.prebuild-others" 2>&1 &
			others=$!
			s=$SECONDS
			echo "test: tier VM e2e scenarios: starting (beside the go tests)"
			# csi-sanity on the VM node (12-16 minutes beside the Go tests)
			# would take the run past CI's 90 minutes; make e2e-vm runs it.
			env BERTH_E2E_NODES=1 BERTH_E2E_VM_NODES=1 BERTH_E2E_CEPH=0 BERTH_E2E_VM_SANITY=0 \
				hack/e2e.sh -timeout 60m -run 'TestE2E/VM'
			r=$?
			echo "$r $((SECONDS - s))" >"$log.vmrc"
			wait "$others"
			cat "$log.prebuild-others"
			rm -f "$log.prebuild-others"
		else
			nice -n 19 hack/prebuild.sh all
		fi
	) >"$log.prebuild" 2>&1 &
	prebuild_pid=$!
fi

# Packages that start API servers or touch loop devices run one at a time
# on our 2-core machines, in hack/gotest.sh's main lane; a short list that
# mostly waits (ganesha grace periods, restarted servers, a test Ceph's
# start) runs one at a time beside it, in its side lane. hack/gotest.sh
# compiles every test binary first, in parallel. As root this includes the
# tests on a real Ceph (internal/testenv/testceph: ~20-45 s to start one
# per package that uses one, plus ~50 s once to install Debian's ceph
# packages), among them csi-sanity on a ceph class in test/sanity.
#
# The build without Ceph (`make build CEPH=0`) keeps working: its own tests
# (what a ceph StorageCluster gets from a binary without the backend) run
# untagged and static, at the end of the main lane. Their test binaries
# build with the others: built alone, after the run, a cold machine spent
# ~15 minutes compiling their dependencies again with CGO_ENABLED=0.
static=()
if [ ${#tags[@]} -gt 0 ]; then
	static=(GOTEST_STATIC_RUN='WithoutTheTag|CephNotBuilt|WithoutCephBuild'
		GOTEST_STATIC_PKGS='./internal/backend/ceph/ ./internal/blockdev/rbdimage/ ./internal/controller/storagecluster/ ./internal/csi/')
fi
# Beside the VM tier the Go tests run at nice 5: qemu emulates the VM
# node's CPU (TCG), so a guest starved of host CPU misses its own timers;
# a CI run with both at one priority saw the VM node's kubelet time out
# TLS handshakes and an agent take 2 minutes to restart (past nbd's dead
# connection timeout) while the Go tests compiled their binaries. The Go
# tests are off the run's critical path: they wait for nothing emulated.
gonice=()
[ -z "$vm_tier" ] || gonice=(nice -n 5)
tier "go tests" "${gonice[@]}" env "${static[@]}" hack/gotest.sh "${tags[@]}" -v "$@"

# The go test run above ran every fuzz target's seed corpus. CI fuzzes no
# further: compiling 16 instrumented builds cost ~8 minutes on a cold
# machine, whose whole run must stay within 80; `make fuzz` (hack/fuzz.sh) is where targets run for a time.
[ -z "$ci" ] || left_out "fuzzing beyond the seeds" "seeds ran with the go tests; make fuzz runs the targets"

# In CI (CI=true, as root) the cluster tiers run too, every one, always:
# the CI subset of the Kubernetes storage conformance suite
# (CONFORMANCE_QUICK=1) and then the end-to-end scenarios on one two-node
# cluster brought up once (conformance keeps it, e2e takes it down with the
# leftovers check), the Ceph scenarios and class on a test Ceph in the
# cluster's network; and last the two multus restart scenarios, in a
# cluster of their own. The VM scenarios ran beside the Go tests (above).
# BERTH_E2E=0 / BERTH_CONFORMANCE=0 / BERTH_E2E_VM_CI=0 /
# BERTH_E2E_MULTUS_CI=0 leave them out, saying so.
if [ -n "$ci" ]; then
	make --no-print-directory -s build
	if [ -n "$prebuild_pid" ]; then
		s=$SECONDS
		echo "test: waiting for the cluster tiers' builds (hack/prebuild.sh)${vm_tier:+ and the VM e2e scenarios}"
		wait "$prebuild_pid" || true
		prebuild_pid=
		echo "test: waited $((SECONDS - s))s"
		# Into the log too: the counts and the failure list read it.
		tee -a "$log" <"$log.prebuild" | grep -vE '^=== (RUN|PAUSE|CONT)'
		rm -f "$log.prebuild"
		if [ -n "$vm_tier" ]; then
			read -r r took <"$log.vmrc" 2>/dev/null || { r=1 took=-; echo "test: the VM tier left no exit code"; }
			rm -f "$log.vmrc"
			[ "$r" -eq 0 ] || rc=$r
			tiers+=("$(printf '%-28s %6ss  exit %s (beside the go tests)' "VM e2e scenarios" "$took" "$r")")
			echo "test: tier VM e2e scenarios: exit $r in ${took}s"
		fi
	fi
	# The e2e tier reuses the cluster the conformance tier kept only when
	# that tier passed: a failed one may leave it in any state.
	reuse=0
	if [ "${BERTH_CONFORMANCE:-1}" != 0 ]; then
		keep=0
		[ "${BERTH_E2E:-1}" = 0 ] || keep=1
		tier "conformance CI subset" env CONFORMANCE_QUICK=1 BERTH_KEEP_CLUSTER=$keep hack/conformance.sh &&
			[ "${tiers[-1]##* }" = 0 ] && reuse=$keep
	else
		left_out "conformance CI subset" "BERTH_CONFORMANCE=0"
	fi
	if [ "${BERTH_E2E:-1}" != 0 ]; then
		tier "e2e scenarios" env BERTH_E2E_REUSE_CLUSTER=$reuse hack/e2e.sh
	else
		left_out "e2e scenarios" "BERTH_E2E=0"
	fi
	if [ "${BERTH_E2E:-1}" = 0 ]; then
		left_out "VM e2e scenarios" "BERTH_E2E=0"
	elif [ -z "$vm_tier" ]; then
		left_out "VM e2e scenarios" "BERTH_E2E_VM_CI=0; make e2e-vm runs them"
	fi
	if [ "${BERTH_E2E:-1}" != 0 ] && [ "${BERTH_E2E_MULTUS_CI:-1}" != 0 ]; then
		# A bring-up of their own (BERTH_E2E_MULTUS=1: multus, whereabouts,
		# the test Ceph on the storage networks only).
		tier "multus e2e scenarios" env BERTH_E2E_MULTUS=1 \
			hack/e2e.sh -run 'TestE2E/(MultusMoverAgentRestarts|MultusNetnsAgentRestarts)$'
	else
		left_out "multus e2e scenarios" "BERTH_E2E=0 or BERTH_E2E_MULTUS_CI=0"
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
if [ "$rc" -ne 0 ]; then
	# CI keeps only the tail of the output: name what failed here, last.
	echo "test: what failed:"
	# Besides failed tests: a tier script's own error (berth dev up/down,
	# a wait that timed out) and what the leftovers check found.
	grep -E '^\s*--- FAIL|^FAIL\s|^panic:|^\S+\.go:[0-9]+: .*(timed out|deadline)|^berth: |^leftover |^\[[a-z ]+[0-9:]+\] .*(FAIL|error|failed)|^e2e: done in .*\(exit [1-9]' "$log" | sort -u | head -30 | sed 's/^/  /' || true
fi
echo "test: tiers:"
printf '  %s\n' "${tiers[@]}"
echo "test: finished in $((SECONDS - start))s"
echo "$passed passed, $failed failed, $skipped skipped"
exit "$rc"
