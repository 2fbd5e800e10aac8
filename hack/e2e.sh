#!/usr/bin/env bash
# End-to-end scenarios on a real Kubernetes (2 nodes unless BERTH_E2E_NODES
# says otherwise) with berth installed:
# `berth dev up --demo=false` (hack/cluster + the berth install), then
# `go test -tags e2e ./test/e2e/...` (extra args go to go test), and always
# `berth dev down`, which fails when anything was left behind.
# BERTH_E2E_CEPH=0 leaves the test Ceph (and so the Ceph scenarios) out;
# BERTH_E2E_MULTUS=1 adds multus (and so runs the multus scenarios);
# BERTH_E2E_VM_NODES=N adds N VM nodes (and so runs the VM scenarios).
# BERTH_KEEP_CLUSTER=1 leaves the cluster up for the next run (no
# `berth dev down`); a cluster that is up already is reused, as
# `berth dev up` only adds what is missing.
#
#   hack/e2e.sh [go test flags]          as root, after `make build`
#   hack/e2e.sh -run 'TestE2E/NodeLossAndReturn$'   one scenario (test/e2e/scenarios_test.go lists them)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export PATH="/usr/local/go/bin:$PATH"
BERTH="${BERTH:-$PWD/bin/berth}"
[ -x "$BERTH" ] || { echo "e2e: $BERTH missing: run make build" >&2; exit 1; }
# This script does not build: a binary of another commit (and the image
# made from it) would be tested without a word. Say so.
built=$("$BERTH" version 2>/dev/null | sed -n 's/.*(commit \([0-9a-f]*\),.*/\1/p' || true)
head=$(git rev-parse --short HEAD 2>/dev/null || true)
if [ -n "$head" ] && [ "$built" != "$head" ]; then
	echo "e2e: warning: $BERTH was built from commit ${built:-unknown}, HEAD is $head: run make build to test this tree" >&2
fi
t0=$SECONDS

finish() {
	local rc=$?
	rm -f "${out:-}"
	if [ "${BERTH_KEEP_CLUSTER:-0}" = 1 ]; then
		echo "e2e: BERTH_KEEP_CLUSTER=1: the cluster stays up" >&2
	else
		"$BERTH" dev down --repo "$PWD" || rc=1
	fi
	echo "e2e: done in $((SECONDS - t0))s (exit $rc)" >&2
	exit "$rc"
}
trap finish EXIT
trap 'exit 130' INT TERM

# The Ceph scenarios (test/e2e/ceph_test.go) run on a ceph StorageCluster
# (berth-ceph) on the test Ceph, in its own netns on the cluster's node
# network (hack/cluster/ceph.sh; ~20 s to boot). Without it they skip,
# saying why; so does this script.
ceph=(--test-ceph)
if [ "${BERTH_E2E_CEPH:-1}" = 0 ]; then
	ceph=()
	echo "e2e: BERTH_E2E_CEPH=0: no test Ceph; the Ceph scenarios skip" >&2
# (grep reads all of ldd's output: with -q it may exit first, and under
# pipefail ldd's SIGPIPE would read as "no librbd".)
elif ! ldd "$BERTH" 2>/dev/null | grep librbd >/dev/null; then
	ceph=()
	echo "e2e: $BERTH is built without the ceph backend (make build CEPH=0): no test Ceph; the Ceph scenarios skip" >&2
elif ! hack/install-deps.sh ceph-mon ceph-osd ceph-mgr ceph-common; then
	ceph=()
	echo "e2e: the ceph packages (ceph-mon ceph-osd ceph-mgr ceph-common) are missing and could not be installed: no test Ceph; the Ceph scenarios skip" >&2
fi

# Multus (hack/cluster/multus.sh) is opt-in for now: BERTH_E2E_MULTUS=1;
# without it the multus scenarios skip, saying why.
multus=()
if [ "${BERTH_E2E_MULTUS:-0}" = 1 ]; then multus=(--multus); fi

# VM nodes (BERTH_E2E_VM_NODES=N, hack/vm): qemu guests with a stock
# kernel after the netns nodes; the VM scenarios (TestE2E/VM...) need one
# and skip without, saying why.
vm=()
if [ "${BERTH_E2E_VM_NODES:-0}" != 0 ]; then vm=(--vm-nodes "$BERTH_E2E_VM_NODES"); fi

# CI starts from nothing: a cluster left up on the machine (an interrupted
# run, another shape) is taken down first, not reused. The one exception:
# BERTH_E2E_REUSE_CLUSTER=1, set by hack/test.sh when its conformance tier
# has just brought up and kept this very shape (~3.5 minutes saved).
if [ "${CI:-}" = true ] && [ "${BERTH_E2E_REUSE_CLUSTER:-0}" != 1 ] &&
	[ -s "${BERTH_E2E_DIR:-/var/lib/berth-e2e}/nodes.list" ]; then
	echo "e2e: CI=true: a cluster is up already; taking it down first" >&2
	"$BERTH" dev down --repo "$PWD"
fi
# Two nodes by default: the scenarios between nodes need them.
"$BERTH" dev up --repo "$PWD" --demo=false --nodes "${BERTH_E2E_NODES:-2}" "${ceph[@]}" "${multus[@]}" "${vm[@]}"
echo "e2e: cluster with berth up after $((SECONDS - t0))s" >&2
# The output is kept to say, after a failure, what the failed scenarios
# logged (hack/lib/faildigest.sh), next to the result.
out=$(mktemp /tmp/berth-e2e-XXXXXX.log)
set +e
BERTH_E2E_ENV="${BERTH_E2E_DIR:-/var/lib/berth-e2e}/cluster.env" \
	go test -tags e2e,netgo,osusergo -trimpath -ldflags=-w -count=1 -p 1 -timeout 40m -v "$@" ./test/e2e/... 2>&1 | tee "$out"
rc=${PIPESTATUS[0]}
set -e
if [ "$rc" -ne 0 ]; then
	# shellcheck source=hack/lib/faildigest.sh
	. hack/lib/faildigest.sh
	fail_digest "$out"
fi
exit "$rc"
