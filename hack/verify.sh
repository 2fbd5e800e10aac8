#!/usr/bin/env bash
# Fails when generated files are stale (regenerates and compares), or when
# gofmt or go vet complain.  Usage: hack/verify.sh MAKE PATH...
set -euo pipefail
cd "$(dirname "$0")/.."
make_cmd=$1
shift

fail=0
sum() { find "$@" -type f -print0 | sort -z | xargs -0 sha256sum; }

before=$(sum "$@")
"$make_cmd" --no-print-directory generate >/dev/null
after=$(sum "$@")
if [ "$before" != "$after" ]; then
	echo "verify: generated files were stale; 'make generate' changed:" >&2
	diff <(echo "$before") <(echo "$after") | sed -n 's/^> [0-9a-f]*  /  /p' >&2
	echo "verify: commit the regenerated files." >&2
	fail=1
fi

unformatted=$(gofmt -l $(git ls-files -co --exclude-standard '*.go'))
if [ -n "$unformatted" ]; then
	echo "verify: gofmt wants to change:" >&2
	echo "$unformatted" | sed 's/^/  /' >&2
	fail=1
fi

if ! go vet ./...; then
	echo "verify: go vet failed" >&2
	fail=1
fi
# The ceph backend is behind a build tag and needs Ceph's C headers.
if ! hack/install-deps.sh librbd-dev librados-dev; then
	echo "verify: cannot vet the ceph backend without librbd-dev and librados-dev" >&2
	fail=1
elif ! go vet -tags ceph,pacific ./internal/backend/ceph/... ./internal/controller/storagecluster/...; then
	echo "verify: go vet -tags ceph,pacific failed" >&2
	fail=1
fi

[ $fail -eq 0 ] && echo "verify: ok"
exit $fail
