#!/usr/bin/env bash
# `make fuzz`: runs every Go fuzz target (func FuzzXxx(f *testing.F) in
# *_test.go) for a bounded time, one target at a time, and prints each
# target's executions and a summary line. Fails when any target finds a
# failing input (go test writes it to the package's testdata/fuzz/FuzzXxx/:
# fix the parser and keep the file as a regression seed).
#   FUZZTIME=60s     time per target (go test -fuzztime)
#   FUZZ_PARALLEL=2  fuzzing workers per target
#   FUZZ_TARGETS=re  only targets whose name matches the extended regexp re
# Each new interesting input is minimized for at most 100 runs (go's
# default, 60 s, stalled targets whose coverage varies, as over a socket).
#   hack/fuzz.sh [package dirs...]   (default: the whole module)
set -uo pipefail
cd "$(dirname "$0")/.."
export PATH="/usr/local/go/bin:$PATH"

fuzztime=${FUZZTIME:-60s}
parallel=${FUZZ_PARALLEL:-2}
filter=${FUZZ_TARGETS:-.}
dirs=("$@")
[ ${#dirs[@]} -gt 0 ] || dirs=(.)

# package dir <TAB> target, one line per target, in a stable order.
targets=$(grep -rEo --include='*_test.go' '^func Fuzz[A-Za-z0-9_]+\(f \*testing\.F\)' "${dirs[@]}" |
	sed -E 's#^(\./)?(.*)/[^/]+_test\.go:func (Fuzz[A-Za-z0-9_]+)\(.*#\2\t\3#' |
	grep -E "	.*$filter" | sort -u)
if [ -z "$targets" ]; then
	echo "fuzz: no targets found" >&2
	exit 1
fi

# The default build's tags (ceph,pacific, as make test uses), so that
# targets in ceph-tagged files run too; without the Ceph libraries, none.
tags=()
if [ "${BERTH_CEPH:-1}" != 0 ] && dpkg-query -W -f='${Status}' librbd-dev 2>/dev/null | grep -q 'install ok installed'; then
	tags=(-tags ceph,pacific,netgo,osusergo)
fi

start=$SECONDS
n=0 crashed=0 skipped=0 total=0 failed=()
while IFS=$'\t' read -r dir target; do
	n=$((n + 1))
	log=$(mktemp)
	for try in 1 2; do
		go test "${tags[@]}" -run='^$' -fuzz="^${target}\$" -fuzztime="$fuzztime" -fuzzminimizetime=100x -parallel="$parallel" "./$dir" >"$log" 2>&1
		rc=$?
		# go's coordinator sometimes fails a run whose time ran out while a
		# busy worker was still answering ("context deadline exceeded"),
		# with no failing input: not a finding, run it once more.
		if [ "$rc" -eq 0 ] || grep -q 'Failing input written' "$log" || ! grep -q 'context deadline exceeded' "$log"; then
			break
		fi
		echo "fuzz: $target: go's fuzz deadline race without a failing input; running it again" >&2
	done
	execs=$(grep -oE 'execs: [0-9]+' "$log" | tail -n 1 | grep -oE '[0-9]+' || true)
	execs=${execs:-0}
	total=$((total + execs))
	if [ "$execs" -eq 0 ] && { [ "$rc" -eq 0 ] || grep -q 'build constraints exclude all Go files' "$log"; }; then
		# Nothing ran: a target in a file whose build tags are off (the
		# ceph ones without librbd-dev) is "no tests to fuzz" to go test,
		# or its whole package is left out.
		skipped=$((skipped + 1))
		why=$(grep -m1 -oE 'no tests to fuzz|build constraints exclude all Go files' "$log" || echo "no executions")
		why="$why (build tags: ${tags[*]:-none})"
		printf 'fuzz: %-28s %-28s %12s execs  SKIPPED: %s\n' "$target" "$dir" "$execs" "$why"
	elif [ "$rc" -eq 0 ]; then
		printf 'fuzz: %-28s %-28s %12s execs  ok\n' "$target" "$dir" "$execs"
	else
		crashed=$((crashed + 1))
		failed+=("$dir $target")
		printf 'fuzz: %-28s %-28s %12s execs  FAILED\n' "$target" "$dir" "$execs"
		grep -vE '^fuzz: elapsed' "$log" | head -60 >&2
	fi
	rm -f "$log"
done <<<"$targets"

echo "fuzz: $n targets, $fuzztime each, $total execs, $crashed failed, $skipped skipped (ran nothing), in $((SECONDS - start))s"
if [ "$crashed" -ne 0 ]; then
	printf 'fuzz: failed: %s\n' "${failed[@]}" >&2
	exit 1
fi
