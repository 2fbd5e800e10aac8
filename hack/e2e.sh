#!/usr/bin/env bash
# End-to-end tests on a real single-node Kubernetes: brings hack/cluster up,
# runs `go test -tags e2e ./test/e2e/...` (extra args go to go test), and
# always brings the cluster down again and checks that nothing was left.
#
#   hack/e2e.sh [go test flags]          as root
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export PATH="/usr/local/go/bin:$PATH"

finish() {
	local rc=$?
	hack/cluster/down.sh || rc=1
	hack/cluster/leftovers.sh || rc=1
	exit "$rc"
}
trap finish EXIT
trap 'exit 130' INT TERM

hack/cluster/up.sh
BERTH_E2E_ENV="${BERTH_E2E_DIR:-/var/lib/berth-e2e}/cluster.env" \
	go test -tags e2e -count=1 -p 1 -v "$@" ./test/e2e/...
