#!/usr/bin/env bash
# `make bench`'s Ceph section: a berth userspace ceph volume (the agent
# stages it: blockdev server on librbd, FUSE file + loop) against
#   - `rbd bench` on the same RBD image (librbd alone: the engine's limit here),
#   - rbd-fuse + `losetup --direct-io=on` (what a user would otherwise pick
#     on a kernel without krbd or nbd),
# on one test Ceph (hack/ceph: 1 mon, 1 mgr, 3 OSDs, pool of size 3), 4k
# random read/write QD64 and 128k sequential QD16, fio direct=1 libaio on
# both block devices. One run of each (test/userspace TestCephBench, built
# with -tags ceph,pacific). Targets: berth >= 0.8x rbd bench, >= 2x rbd-fuse;
# reported, not asserted.
# Env: BENCH_SECONDS (fio seconds per job, default 10), BENCH_CEPH_MIB (image
# size, default 1024), BENCH_CEPH_RBD_4K_MIB (what each 4k rbd bench moves,
# default 128). Needs root, fio, FUSE, loop devices; installs rbd-fuse and
# the Ceph packages when missing. Leaves nothing: the test stops rbd-fuse,
# the agent, servers and Ceph by PID, removes loop devices, mounts and the
# image; this script checks that after it.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="/usr/local/go/bin:$PATH"

hack/install-deps.sh rbd-fuse fio librbd-dev librados-dev
KUBEBUILDER_ASSETS=$(hack/kube-binaries.sh | tail -n 1)
export KUBEBUILDER_ASSETS

out=$(mktemp)
trap 'rm -f "$out"' EXIT
BERTH_CEPH_BENCH=1 BERTH_MEMORY_BENCH=1 CGO_ENABLED=1 go test -trimpath -tags ceph,pacific,netgo,osusergo -count=1 -v -timeout 40m \
	-run 'TestCephBench$|TestIdleCephServerMemory$' ./test/userspace/ 2>&1 | tee "$out" && rc=0 || rc=$?

# Leftovers: the test's own Ceph (its folder and ports, as
# test/userspace's cephLazy places it), rbd-fuse, this volume's servers,
# loop devices and mounts.
BERTH_CEPH_DIR=/var/lib/berth-ceph-userspace-test BERTH_CEPH_MON_PORT=3316 BERTH_CEPH_PORT_MIN=7600 \
	BERTH_CEPH_PORT_MAX=7699 hack/ceph/leftovers.sh || rc=1
left=$(
	pgrep -a -x rbd-fuse || true
	pgrep -a -f 'blockdev .*--volume ceph-(bench|memory-[0-9]+)( |$)' || true
	losetup -a | grep -E 'TestCephBench|/ceph-bench[/)]' || true
	grep -E 'rbd-fuse|TestCephBench|/ceph-bench( |/)' /proc/self/mountinfo || true
)
if [ -n "$left" ]; then
	printf 'leftovers of the ceph bench:\n%s\n' "$left" >&2
	rc=1
fi

echo
echo "== Ceph: berth userspace volume / rbd bench / rbd-fuse + loop (one run; $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg))"
# rbd-b/nc, fuse/nc: rbd bench and rbd-fuse with librbd's cache off (writes
# only), as berth runs librbd: the same durability (as they come, with the
# cache on, policy writearound, they acknowledge writes before they are in
# Ceph); the targets are against rbd bench and rbd-fuse as they come.
grep '^CEPH_BENCH_RESULT' "$out" | awk '
function ratio(x, y) { return y > 0 ? sprintf("%.2f", x / y) : "-" }
function orDash(x) { return x > 0 ? x : "-" }
BEGIN { printf "%-18s %-5s %9s %9s %9s %9s %9s %9s %-6s %9s %9s %-6s %9s\n", "workload", "unit", "rbd-bench", "rbd-b/nc", "rbd-fuse", "fuse/nc",
	"berth", "/rbdbench", ">=0.8", "/rbd-b/nc", "/rbd-fuse", ">=2", "/fuse/nc" }
{
	for (i = 2; i <= NF; i++) { split($i, p, "="); v[p[1]] = p[2] }
	w = v["workload"]; gsub(/_/, " ", w)
	a = v["rbd_bench"] > 0 ? v["berth"] / v["rbd_bench"] : 0
	b = v["rbd_fuse"] > 0 ? v["berth"] / v["rbd_fuse"] : 0
	printf "%-18s %-5s %9s %9s %9s %9s %9s %9.2f %-6s %9s %9.2f %-6s %9s\n", w, v["unit"], v["rbd_bench"], orDash(v["rbd_bench_nocache"]),
		v["rbd_fuse"], orDash(v["rbd_fuse_nocache"]), v["berth"], a, (a >= 0.8) ? "met" : "MISSED",
		ratio(v["berth"], v["rbd_bench_nocache"]), b, (b >= 2) ? "met" : "MISSED", ratio(v["berth"], v["rbd_fuse_nocache"])
}'
[ "$rc" -eq 0 ] || echo "ceph bench FAILED (exit $rc): its figures do not count" >&2
exit "$rc"
