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
# deploy/'s alert test loads the chart's rules into Debian's Prometheus.
if BERTH_PROMETHEUS_DIR=$(hack/prometheus.sh | tail -n 1); then
	export BERTH_PROMETHEUS_DIR
else
	echo "test: hack/prometheus.sh failed: TestAlertsEvaluateInPrometheus will skip" >&2
	unset BERTH_PROMETHEUS_DIR
fi
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
# netgo,osusergo as the Makefile's CEPH_TAGS: the build cache then serves
# make build, the tests and their static builds alike.
tags=(-tags ceph,pacific,netgo,osusergo)
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
	flush_background
}
# left_out NAME WHY: a tier that does not run says so, in the table too.
left_out() {
	echo "test: tier $1: left out: $2"
	tiers+=("$(printf '%-28s %7s  left out: %s' "$1" "-" "$2")")
}

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
gotests=(env "${static[@]}" hack/gotest.sh "${tags[@]}" -v "$@")

# In CI (CI=true, as root) the cluster tiers run too, every one, always,
# one cluster at a time, in the foreground: first the VM scenarios (kernel
# NFS client, nbd, ublk, a real power-off: one netns node and one VM node,
# qemu under TCG) and two specs of the Kubernetes storage suite on RWX
# claims on that cluster; then the CI subset of the storage suite
# (CONFORMANCE_QUICK=1) and the end-to-end scenarios on one two-node
# cluster brought up once (conformance keeps it, e2e takes it down with
# the leftovers check), the Ceph scenarios and class on a test Ceph in the
# cluster's network; and last the two multus restart scenarios, in a
# cluster of their own.
#
# The VM tiers run with nothing beside them. A TCG guest is one scheduling
# group of the host (autogroups: a session each), so it gets one core of
# two against any other busy session: in the last CI run with the Go tests
# beside it, its agent's container took over 3 minutes to create, and
# every scenario that waited for a pod on the VM node timed out (the run
# before passed the same way, narrowly: bring-up 618 s, 310 s alone).
# The Go tests start once the VM tiers end, beside the netns cluster tiers
# (native speed, waiting mostly on grace periods and timers), in a CPU
# cgroup of low weight (hack/lib/cpushare.sh): they take what those
# clusters leave. They share nothing with a cluster: it lives in its own
# network namespaces, under /var/lib/berth-e2e and /run/berth, which no Go
# test touches, and its leftovers check looks only there. The run ends
# when both lanes have.
# BERTH_E2E=0 / BERTH_CONFORMANCE=0 / BERTH_E2E_VM_CI=0 /
# BERTH_E2E_MULTUS_CI=0 leave tiers out, saying so.
go_pid=
late_pid=
bg_cg=
# On the way out (a failure, or CI's time up) nothing of the background
# lane may run on: its processes are all in its cgroup.
stop_background() {
	local p
	if [ -n "$bg_cg" ] && [ -d "$bg_cg" ]; then
		for p in $(cat "$bg_cg/cgroup.procs" 2>/dev/null); do kill "$p" 2>/dev/null; done
		cpushare_remove "$bg_cg" || true
	else
		[ -z "$go_pid" ] || kill "$go_pid" 2>/dev/null
		[ -z "$late_pid" ] || kill "$late_pid" 2>/dev/null
	fi
}
trap 'stop_background; rm -f "$log" "$log.go" "$log.gorc" "$log.late" "$log.late.done"' EXIT
# flush_background: once a background job (the late builds, the Go tier)
# has ended, its output goes into the log and out (between two cluster
# tiers, never within one), and the Go tier's into the table.
flush_background() {
	local r took
	if [ -n "$late_pid" ] && [ -e "$log.late.done" ]; then
		wait "$late_pid" 2>/dev/null || true
		late_pid=
		tee -a "$log" <"$log.late"
		rm -f "$log.late" "$log.late.done"
	fi
	[ -n "$go_pid" ] && [ -s "$log.gorc" ] || return 0
	wait "$go_pid" 2>/dev/null || true
	go_pid=
	read -r r took <"$log.gorc" || { r=1 took=-; }
	echo "test: tier go tests (beside the cluster tiers): its output follows"
	tee -a "$log" <"$log.go" | grep -vE '^=== (RUN|PAUSE|CONT)'
	[ "$r" -eq 0 ] || rc=$r
	tiers+=("$(printf '%-28s %6ss  exit %s (beside the cluster tiers)' "go tests" "$took" "$r")")
	echo "test: tier go tests: exit $r in ${took}s"
	rm -f "$log.go" "$log.gorc"
}

if [ -z "$ci" ]; then
	tier "go tests" "${gotests[@]}"
else
	make --no-print-directory -s build
	# shellcheck source=hack/lib/cpushare.sh
	. hack/lib/cpushare.sh
	# 256 of a session's 1024: against each busy cluster daemon (qemu, an
	# API server) the Go tests get a fifth of a core, and every core no
	# cluster wants. Starved further, Go tests' own timers (an envtest
	# API server's start, a heal's deadline) would be at risk.
	if bg_cg=$(cpushare_create berth-test-background 256); then
		bg=(cpushare_run "$bg_cg")
	else
		bg=(nice -n 10)
		echo "test: warning: no CPU cgroup could be made; go tests in the background at nice 10 only"
	fi
	# start_go_tests: the Go tier, in the background from now on.
	start_go_tests() {
		echo "test: tier go tests: starting at $((SECONDS - start))s, beside the cluster tiers (${bg[*]})"
		(
			s=$SECONDS r=0
			# Not a bare command: under set -e a failure would end the
			# subshell before it records the result, and the run would
			# print nothing of the Go tests and count them passed.
			"${bg[@]}" "${gotests[@]}" >"$log.go" 2>&1 || r=$?
			echo "$r $((SECONDS - s))" >"$log.gorc"
		) &
		go_pid=$!
	}

	# start_late_builds: hack/prebuild.sh late, in the background.
	start_late_builds() {
		echo "test: prebuild late: starting at $((SECONDS - start))s, beside the cluster tiers"
		(
			s=$SECONDS
			"${bg[@]}" hack/prebuild.sh late >"$log.late" 2>&1 || true
			echo "test: prebuild late in $((SECONDS - s))s" >>"$log.late"
			touch "$log.late.done"
		) &
		late_pid=$!
	}

	# prebuild PART: the cluster tiers' pinned binaries (hack/prebuild.sh;
	# each builder skips what is cached), in the foreground.
	prebuild() {
		local s=$SECONDS
		hack/prebuild.sh "$1" 2>&1 | tee -a "$log" || true
		echo "test: prebuild $1 in $((SECONDS - s))s"
	}
	if [ "${BERTH_E2E:-1}" = 0 ]; then
		left_out "VM e2e scenarios" "BERTH_E2E=0"
		left_out "conformance RWX on the VM node" "BERTH_E2E=0"
		start_go_tests
		prebuild all
	elif [ "${BERTH_E2E_VM_CI:-1}" = 1 ]; then
		prebuild vm
		# The VM tier: 2 nbd heal cycles, 1 ublk cycle of 3 volumes (a cycle
		# is a new agent pod on the TCG node, ~30-40 s; a volume's writer
		# and verifier pods ~2 minutes), and no csi-sanity on the VM node
		# (~8 minutes). With 10 and 3 cycles of 5 ublk volumes the tier
		# took ~55 minutes alone, with 4 and 2 cycles of 5 49 minutes (ublk 18),
		# and the run passed 90. make e2e-vm runs them all (20 nbd cycles,
		# 5 ublk ones of 5 volumes, csi-sanity).
		# No test Ceph, so no krbd scenario: with it the VM node was
		# slower, and the ublk scenario's pods missed their 3-minute wait
		# for Running (a run of bbc1c8b). make e2e-vm runs it.
		# The cluster stays up for the storage suite's RWX class next.
		tier "VM e2e scenarios" env BERTH_E2E_NODES=1 BERTH_E2E_VM_NODES=1 BERTH_E2E_CEPH=0 BERTH_E2E_VM_SANITY=0 \
			BERTH_E2E_NBD_HEAL_CYCLES=2 BERTH_E2E_UBLK_HEAL_CYCLES=1 \
			BERTH_E2E_UBLK_HEAL_VOLUMES=3 BERTH_KEEP_CLUSTER=1 \
			hack/e2e.sh -timeout 60m -run 'TestE2E/VM'
		# e2e.test and ginkgo for the storage suite (cached: a second).
		prebuild suite
		# The storage suite on RWX claims, mounted by the VM node's kernel
		# NFS client (test/conformance/berth-rwx.yaml), on the same cluster:
		# one spec that writes and reads (two pods on one volume there:
		# VMReadWriteManyKernelClient; make conformance runs the class).
		# It takes the cluster down.
		rwx_focus='\[Testpattern: Dynamic PV \(default fs\)\] volumes should store data$'
		tier "conformance RWX on the VM node" env CONFORMANCE_CLASSES=berth-rwx CONFORMANCE_QUICK=1 \
			CONFORMANCE_FOCUS="$rwx_focus" hack/conformance.sh
		start_go_tests
		# What only the last tiers use (multus, whereabouts, the previous
		# release: ~240 s of both cores cold), beside the next tiers, in the
		# Go tests' cgroup; a tier that needs one first waits for its build
		# (hack/lib/gobuild.sh's cache_lock).
		start_late_builds
	else
		left_out "VM e2e scenarios" "BERTH_E2E_VM_CI=0; make e2e-vm runs them"
		left_out "conformance RWX on the VM node" "BERTH_E2E_VM_CI=0; make conformance runs it"
		start_go_tests
		prebuild all
	fi
	# The e2e tier reuses the cluster the conformance tier kept only when
	# that tier passed: a failed one may leave it in any state.
	reuse=0
	if [ "${BERTH_CONFORMANCE:-1}" != 0 ]; then
		keep=0
		[ "${BERTH_E2E:-1}" = 0 ] || keep=1
		tier "conformance CI subset" env CONFORMANCE_QUICK=1 BERTH_KEEP_CLUSTER=$keep \
			CONFORMANCE_CLASSES="berth berth-userspace berth-ceph-userspace" hack/conformance.sh &&
			[ "${tiers[-1]##* }" = 0 ] && reuse=$keep
	else
		left_out "conformance CI subset" "BERTH_CONFORMANCE=0"
	fi
	if [ "${BERTH_E2E:-1}" != 0 ]; then
		tier "e2e scenarios" env BERTH_E2E_REUSE_CLUSTER=$reuse hack/e2e.sh
	else
		left_out "e2e scenarios" "BERTH_E2E=0"
	fi
	if [ "${BERTH_E2E:-1}" != 0 ] && [ "${BERTH_E2E_MULTUS_CI:-1}" != 0 ]; then
		# A bring-up of their own (BERTH_E2E_MULTUS=1: multus, whereabouts,
		# the test Ceph on the storage networks only).
		tier "multus e2e scenarios" env BERTH_E2E_MULTUS=1 \
			hack/e2e.sh -run 'TestE2E/(MultusMoverAgentRestarts|MultusNetnsAgentRestarts)$'
	else
		left_out "multus e2e scenarios" "BERTH_E2E=0 or BERTH_E2E_MULTUS_CI=0"
	fi
	if [ -n "$late_pid" ]; then
		wait "$late_pid" 2>/dev/null || true
		touch "$log.late.done"
		flush_background
	fi
	if [ -n "$go_pid" ]; then
		s=$SECONDS
		echo "test: the cluster tiers are done; waiting for the go tests"
		wait "$go_pid" || true
		echo "test: waited $((SECONDS - s))s for the go tests"
		flush_background
	fi
	[ "${bg[0]}" != cpushare_run ] || cpushare_remove "$bg_cg" || true
	bg_cg=
fi

# The go test run above ran every fuzz target's seed corpus. CI fuzzes no
# further: compiling 16 instrumented builds cost ~8 minutes on a cold
# machine, whose whole run must stay within 80; `make fuzz` (hack/fuzz.sh) is where targets run for a time.
[ -z "$ci" ] || left_out "fuzzing beyond the seeds" "seeds ran with the go tests; make fuzz runs the targets"

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
