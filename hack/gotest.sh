#!/usr/bin/env bash
# Runs every package's Go tests like `go test -p 1 -v`, but compiles the test
# binaries first, in parallel, and only then runs them one at a time.
# `go test -p 1` also serializes compiling and linking: on a cold 2-core
# machine that left one core idle for most of the build. Running one package
# at a time stays: packages that start API servers or touch loop devices must
# not overlap.
#
#   hack/gotest.sh [-tags T] [test flags...] [-- packages...]
#
# Test flags are the test binary's (-run, -short, -count, -timeout, -v,
# -failfast, ...), given as to go test; the default timeout is 30m per
# package. Packages default to ./... . Prints go test's per-package lines
# ("ok", "FAIL", "?") and exits 1 when any package failed or did not build.
# GOTEST_BUILD_JOBS (default: the number of CPUs) builds run at once.
set -uo pipefail
cd "$(dirname "$0")/.."
export PATH="/usr/local/go/bin:$PATH"

tags=()
flags=()
pkgs=()
while [ $# -gt 0 ]; do
	case $1 in
	-tags) tags=(-tags "$2"); shift 2 ;;
	-tags=*) tags=("$1"); shift ;;
	--) shift; pkgs=("$@"); break ;;
	# go test's flags are the binary's with a "test." prefix.
	-test.*) flags+=("$1"); shift ;;
	-*=*) flags+=("-test.${1#-}"); shift ;;
	-v | -short | -failfast | -json) flags+=("-test.${1#-}"); shift ;;
	-*) flags+=("-test.${1#-}" "$2"); shift 2 ;;
	*) pkgs+=("$1"); shift ;;
	esac
done
[ ${#pkgs[@]} -gt 0 ] || pkgs=(./...)
case " ${flags[*]} " in *" -test.timeout"*) ;; *) flags+=(-test.timeout=30m) ;; esac
case " ${flags[*]} " in *" -test.count"*) ;; *) flags+=(-test.count=1) ;; esac
# go test exits non-zero on os.Exit(0) from a test; so do we.
flags+=(-test.paniconexit0)

out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

# import path <TAB> dir, for each package that has tests, in go list order.
list=$(go list "${tags[@]}" -f '{{if or .TestGoFiles .XTestGoFiles}}{{.ImportPath}}	{{.Dir}}{{end}}' "${pkgs[@]}") || exit 1
# The same for packages without tests, for go test's "?" lines.
none=$(go list "${tags[@]}" -f '{{if not (or .TestGoFiles .XTestGoFiles)}}{{.ImportPath}}{{end}}' "${pkgs[@]}") || exit 1

start=$SECONDS
# Builds: each into out/N.test, its output in out/N.build. vet is left to
# `make verify` (go vet over every package).
n=0
while IFS=$'\t' read -r pkg _; do
	[ -n "$pkg" ] || continue
	printf '%s\t%s\n' "$n" "$pkg"
	n=$((n + 1))
done <<<"$list" >"$out/index"
jobs=${GOTEST_BUILD_JOBS:-$(nproc)}
export GOTEST_TAGS="${tags[*]}"
# xargs gives each line as $1 (N) and $2 (the package); $0 is the folder.
# shellcheck disable=SC2016,SC2086
xargs -P "$jobs" -L 1 bash -c 'go test -c -vet=off $GOTEST_TAGS -o "$0/$1.test" "$2" >"$0/$1.build" 2>&1 || touch "$0/$1.failed"' \
	"$out" <"$out/index"
echo "gotest: built $n test binaries in $((SECONDS - start))s ($jobs at once)"

rc=0
while IFS=$'\t' read -r i pkg; do
	dir=$(awk -F'\t' -v p="$pkg" '$1 == p { print $2 }' <<<"$list")
	if [ -e "$out/$i.failed" ]; then
		cat "$out/$i.build"
		echo "FAIL	$pkg [build failed]"
		rc=1
		continue
	fi
	t=$(date +%s.%N)
	# Run from the package's folder, as go test does (testdata, relative paths).
	(cd "$dir" && "$out/$i.test" "${flags[@]}")
	r=$?
	took=$(awk -v a="$t" -v b="$(date +%s.%N)" 'BEGIN { printf "%.3fs", b - a }')
	if [ "$r" -eq 0 ]; then
		echo "ok  	$pkg	$took"
	else
		echo "FAIL	$pkg	$took"
		rc=1
	fi
	rm -f "$out/$i.test"
done <"$out/index"
while read -r pkg; do
	[ -z "$pkg" ] || echo "?   	$pkg	[no test files]"
done <<<"$none"
echo "gotest: done in $((SECONDS - start))s"
exit "$rc"
