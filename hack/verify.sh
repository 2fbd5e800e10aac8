#!/usr/bin/env bash
# Fails when generated files are stale (regenerates and compares), or when
# gofmt or go vet complain.  Usage: hack/verify.sh MAKE PATH...
set -euo pipefail
cd "$(dirname "$0")/.."
make_cmd=$1
shift

fail=0
hack/docs-check.sh || fail=1
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

# Both builds: the default one with the ceph backend (cgo, Ceph's C
# headers) and the static one without it (`make build CEPH=0`).
if ! CGO_ENABLED=0 go vet -trimpath ./...; then
	echo "verify: go vet (without ceph) failed" >&2
	fail=1
fi
if ! hack/install-deps.sh --ceph-build; then
	echo "verify: cannot vet the ceph build without gcc, librbd-dev and librados-dev" >&2
	fail=1
elif ! CGO_ENABLED=1 go vet -trimpath -tags ceph,pacific,netgo,osusergo ./...; then
	echo "verify: go vet -tags ceph,pacific,netgo,osusergo failed" >&2
	fail=1
fi

[ $fail -eq 0 ] && echo "verify: ok"
exit $fail
