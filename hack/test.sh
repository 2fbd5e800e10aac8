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
