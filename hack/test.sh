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
# -p 1: packages that start API servers or touch loop devices run one at a
# time on our 2-core machines.
set +e
go test -p 1 -count=1 -timeout 30m -v "$@" ./... 2>&1 | tee "$log" | grep -vE '^=== (RUN|PAUSE|CONT)'
rc=${PIPESTATUS[0]}
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

# In CI (CI=true, as root) the end-to-end scenarios run too when the rest of
# CI's budget (BERTH_CI_BUDGET_SECONDS, 90 min) still fits them: about 40
# min cold (kube binaries and CSI sidecars built) and 5 min with the cache
# (~/.cache/berth). BERTH_E2E=0 leaves them out.
if [ "${CI:-}" = true ] && [ "${BERTH_E2E:-1}" != 0 ] && [ "$(id -u)" -eq 0 ]; then
	cache="${BERTH_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/berth}"
	need=300
	[ -x "$cache/kube-v1.34.4-etcd-v3.6.5/kubelet" ] && [ -x "$cache/csi-sidecars/csi-resizer-v1.14.0" ] || need=2400
	left=$((${BERTH_CI_BUDGET_SECONDS:-5400} - (SECONDS - start)))
	if [ "$left" -gt "$need" ]; then
		echo "test: running the e2e scenarios (about ${need}s; ${left}s of CI's budget left)"
		set +e
		{ make build && hack/e2e.sh; } 2>&1 | tee -a "$log" | grep -vE '^=== (RUN|PAUSE|CONT)'
		e2e=${PIPESTATUS[0]}
		set -e
		[ "$e2e" -eq 0 ] || rc=$e2e
	else
		echo "test: e2e left out: it needs about ${need}s, ${left}s of CI's budget left"
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
