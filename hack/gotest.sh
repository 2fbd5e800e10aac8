#!/usr/bin/env bash
# Runs every package's Go tests like `go test -p 1 -v`, but compiles the test
# binaries first, in parallel, and runs them in two lanes.
# `go test -p 1` also serializes compiling and linking: on a cold 2-core
# machine that left one core idle for most of the build.
#
# The main lane runs the packages one at a time, after every build is done:
# packages that start API servers or touch loop devices mostly must not
# overlap.
#
# The side lane runs a short list of packages (GOTEST_SIDE) one at a time,
# beside the main lane. They spend most of their time waiting: a new
# ganesha and its grace period, killed and restarted servers, a test Ceph
# starting. The side lane starts as soon as its own binaries are built (they
# are built first). Its packages share nothing with any other package:
#   - ports: testenv.FreePort, or a test Ceph's own MonPort and port range
#     (each package has its own, see internal/testenv/testceph);
#   - folders: each test's own temp dir, or a test Ceph's own Dir;
#   - leftover checks (losetup, mountinfo, /sys/block/loop*) look only at
#     the test's own folders;
#   - loop devices: `losetup --find` adds one when none is free.
# A side-lane package's output is kept until it ends, then printed whole
# between two main-lane packages (or after the main lane), so that the two
# lanes' lines never mix.
#
# GOTEST_STATIC_PKGS are also built without tags and with CGO_ENABLED=0, in
# the same build phase, and run at the end of the main lane with
# -run "$GOTEST_STATIC_RUN": the build without Ceph (`make build CEPH=0`).
# Their lines say "[CGO_ENABLED=0, no tags]".
#
#   hack/gotest.sh [-tags T] [test flags...] [-- packages...]
#
# Test flags are the test binary's (-run, -short, -count, -timeout, -v,
# -failfast, ...), given as to go test; the default timeout is 30m per
# package. Packages default to ./... . Prints go test's per-package lines
# ("ok", "FAIL", "?") and exits 1 when any package failed or did not build.
# GOTEST_BUILD_JOBS (default: the number of CPUs) builds run at once.
# GOTEST_SIDE: the side lane's packages, as paths below the module
# (default below); empty runs every package in the main lane.
set -uo pipefail
cd "$(dirname "$0")/.."
export PATH="/usr/local/go/bin:$PATH"

# The side lane, in this order. Each waits more than it computes:
# test/userspace on killed servers, heal cycles and its two test Ceph
# clusters; test/sanity on its test Ceph and csi-sanity's many short
# calls; internal/blockdev on fio's timed runs under server takeovers;
# internal/cli/sharemanager on ganesha restarts and grace periods (20
# failovers per NFS version). The heaviest go first, beside the builds
# (which yield: nice 10); the sharemanager failovers, which wait the most,
# go last, beside the main lane's CPU-bound internal/fence races.
side_default="test/userspace test/sanity internal/blockdev internal/cli/sharemanager"

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
side_pid=
trap '[ -z "$side_pid" ] || kill "$side_pid" 2>/dev/null; rm -rf "$out"' EXIT

# import path <TAB> dir, for each package that has tests, in go list order.
testlist='{{if or .TestGoFiles .XTestGoFiles}}{{.ImportPath}}	{{.Dir}}{{end}}'
list=$(go list "${tags[@]}" -f "$testlist" "${pkgs[@]}") || exit 1
# The same for packages without tests, for go test's "?" lines.
none=$(go list "${tags[@]}" -f '{{if not (or .TestGoFiles .XTestGoFiles)}}{{.ImportPath}}{{end}}' "${pkgs[@]}") || exit 1
static=
if [ -n "${GOTEST_STATIC_PKGS:-}" ]; then
	# shellcheck disable=SC2086 # a list of packages
	static=$(CGO_ENABLED=0 go list -f "$testlist" $GOTEST_STATIC_PKGS) || exit 1
fi
module=$(go list -m)

# The side lane's import paths, in its order.
side=()
for p in ${GOTEST_SIDE-$side_default}; do
	p=${p#./}
	side+=("$module/${p%/}")
done
# in_side PKG: whether PKG is one of the side lane's.
in_side() {
	local p
	for p in "${side[@]}"; do
		[ "$1" != "$p" ] || return 0
	done
	return 1
}

start=$SECONDS
# The index: N <TAB> lane (side, main or static) <TAB> package <TAB> dir,
# in build order: the side lane first, in its order, so that it starts
# early.
{
	for p in "${side[@]}"; do
		awk -F'\t' -v p="$p" '$1 == p { print "side\t" $0 }' <<<"$list"
	done
	while IFS=$'\t' read -r pkg dir; do
		[ -z "$pkg" ] || in_side "$pkg" || printf 'main\t%s\t%s\n' "$pkg" "$dir"
	done <<<"$list"
	while IFS=$'\t' read -r pkg dir; do
		[ -z "$pkg" ] || printf 'static\t%s\t%s\n' "$pkg" "$dir"
	done <<<"$static"
} | awk '{ print NR - 1 "\t" $0 }' >"$out/index"
n=$(wc -l <"$out/index")

# run I PKG DIR [FLAGS...]: runs test binary I from the package's folder, as
# go test does (testdata, relative paths), and prints go test's package line.
run() {
	local i=$1 pkg=$2 dir=$3 note=$4 t r took
	shift 4
	until [ -e "$out/$i.built" ] || [ -e "$out/$i.failed" ]; do sleep 1; done
	if [ -e "$out/$i.failed" ]; then
		cat "$out/$i.build"
		echo "FAIL	$pkg [build failed]$note"
		return 1
	fi
	t=$(date +%s.%N)
	(cd "$dir" && "$out/$i.test" "$@")
	r=$?
	took=$(awk -v a="$t" -v b="$(date +%s.%N)" 'BEGIN { printf "%.3fs", b - a }')
	rm -f "$out/$i.test"
	if [ "$r" -eq 0 ]; then
		echo "ok  	$pkg	$took$note"
	else
		echo "FAIL	$pkg	$took$note"
		return 1
	fi
}

# The side lane: each package's output into out/N.out, then out/N.done
# holding its exit code.
if grep -q $'^[0-9]*\tside\t' "$out/index"; then
	(
		while IFS=$'\t' read -r -u 3 i lane pkg dir; do
			[ "$lane" = side ] || continue
			run "$i" "$pkg" "$dir" "" "${flags[@]}" >"$out/$i.out" 2>&1
			echo $? >"$out/$i.done"
		done 3<"$out/index"
		echo "$((SECONDS - start))" >"$out/side.end"
	) &
	side_pid=$!
fi
# flush_side: prints the side lane's packages that ended, in order, once.
flush_side() {
	local i lane
	while IFS=$'\t' read -r i lane _; do
		[ "$lane" = side ] || continue
		[ ! -e "$out/$i.printed" ] || continue
		[ -e "$out/$i.done" ] || return 0
		cat "$out/$i.out"
		[ "$(cat "$out/$i.done")" = 0 ] || rc=1
		touch "$out/$i.printed"
	done <"$out/index"
}

# Builds: each into out/N.test, its output in out/N.build, then out/N.built
# or out/N.failed. vet is left to `make verify` (go vet over every package).
# -trimpath as `make build`, `make verify`'s vet and hack/e2e.sh: with other
# flags every dependency compiles again, once per flag set (a cold machine
# spent ~290 s of both cores on each set). -ldflags=-w: no DWARF, which
# nothing here reads; a test binary links in 7 s instead of 11.
# They run at a lower CPU priority than the side lane's first tests, which
# start meanwhile and keep leases and deadlines.
jobs=${GOTEST_BUILD_JOBS:-$(nproc)}
export GOTEST_TAGS="${tags[*]}"
# xargs gives each line's fields as $1 (N), $2 (lane) and $3 (package); $0
# is the folder.
# shellcheck disable=SC2016,SC2086
cut -f1-3 "$out/index" | tr '\t' ' ' | nice -n 10 xargs -P "$jobs" -L 1 bash -c '
	if [ "$2" = static ]; then set -- "$1" "$3" env CGO_ENABLED=0 go test -c -vet=off -trimpath -ldflags=-w
	else set -- "$1" "$3" go test -c -vet=off -trimpath -ldflags=-w $GOTEST_TAGS; fi
	i=$1 pkg=$2; shift 2
	if "$@" -o "$0/$i.test" "$pkg" >"$0/$i.build" 2>&1; then touch "$0/$i.built"; else touch "$0/$i.failed"; fi' \
	"$out"
echo "gotest: built $n test binaries in $((SECONDS - start))s ($jobs at once)"

built=$((SECONDS - start))
rc=0
while IFS=$'\t' read -r -u 3 i lane pkg dir; do
	case $lane in
	main) run "$i" "$pkg" "$dir" "" "${flags[@]}" || rc=1 ;;
	static) run "$i" "$pkg" "$dir" " [CGO_ENABLED=0, no tags]" -test.run="${GOTEST_STATIC_RUN:-.}" "${flags[@]}" || rc=1 ;;
	*) continue ;;
	esac
	flush_side
done 3<"$out/index"
if [ -n "$side_pid" ]; then
	main_end=$((SECONDS - start))
	wait "$side_pid"
	side_pid=
	flush_side
	echo "gotest: builds done at ${built}s; main lane ended at ${main_end}s, side lane at $(cat "$out/side.end")s"
fi
while read -r pkg; do
	[ -z "$pkg" ] || echo "?   	$pkg	[no test files]"
done <<<"$none"
echo "gotest: done in $((SECONDS - start))s"
exit "$rc"
