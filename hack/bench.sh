#!/usr/bin/env bash
# `make bench`: one table of the userspace volume's figures against targets.
#  1. fio on a userspace block device (keeper + blockdev server + loop) as a
#     ratio of a kernel loop device on the same machine (hack/bench-blockdev.sh),
#     in the mode the agent uses by default (FUSE passthrough).
#  2. Healing: the time from agent start to the first successful write on
#     every healed volume, p50/p99 over BERTH_HEAL_CYCLES (default 50) cycles
#     of SIGKILLing the agent and every blockdev server under verifying
#     writers (test/userspace TestHealUnderWriters).
#  2b. Healing at scale: the same figure with BENCH_HEAL_SCALE_VOLUMES (default
#     100) userspace volumes on one node, each with a verifying writer, over
#     BENCH_HEAL_SCALE_CYCLES (default 10) SIGKILLs, once with FUSE passthrough
#     on and once off (target p99 <= 1s). BENCH_HEAL_SCALE=0 leaves it out.
#  2c. Keeper hand-over: the longest write+fdatasync+read round of each of
#     5 userspace volumes with verifying writers while the keeper process is
#     replaced BERTH_KEEPER_HANDOVERS (default 50) times, some servers
#     restarted meanwhile, p50/p99/max (internal/blockdev
#     TestKeeperHandOverUnderWriters; 0 errors asserted, target p99 <= 1s).
#     BENCH_KEEPER=0 leaves it out.
#  3. Provisioning: the time from PVC create to pod Running, p50/p99 over
#     BERTH_BENCH_PVCS (default 20) claims and pods created at once on one
#     node, for the kernel and the userspace mounter, against the same pods
#     with an emptyDir (target p99 <= 1.5x), on a BENCH_NODES (default 2) node
#     e2e cluster (hack/e2e.sh; test/e2e TestBenchPVCToRunning). BENCH_PVC=0
#     leaves it out. On the same cluster, the RWX failover for a lapsed
#     Lease: the share-manager pod frozen -> first verified client write,
#     p50/p99 over BERTH_BENCH_LEASE_FAILOVERS (default 20) rounds (test/e2e
#     TestBenchShareLeaseFailover; target <= 22 s).
#  4. RWX failover: kill -> first acknowledged client write, p50/p99 over
#     BERTH_SHARE_FAILOVERS (default 20) SIGKILLs of ganesha or the share
#     manager, for an NFSv4.0 client (stable writes) and an NFSv4.1 one
#     (COMMIT) (internal/cli/sharemanager TestFailoverLosesNoAcknowledgedWrite;
#     target <= 10 s for a killed server).
#  5. Ceph: a berth userspace ceph volume against `rbd bench` on an image of
#     the same test Ceph pool and against rbd-fuse + loop, 4k random QD64 and
#     128k sequential (hack/bench-ceph.sh; targets >= 0.8x rbd bench, >= 2x
#     rbd-fuse). BENCH_CEPH=0 leaves it out.
#  6. Memory: the median idle blockdev server's resident, anonymous and
#     proportional (PSS) memory and threads, over BENCH_MEMORY_VOLUMES
#     (default 10) staged local userspace volumes (test/userspace
#     TestIdleServerMemory) and as many ceph ones (hack/bench-ceph.sh;
#     target PSS <= 6 MiB). BENCH_MEMORY=0 leaves the local one out.
# Env: BENCH_SECONDS (fio seconds per run, default 10), BENCH_SIZE (default 1G),
#      BENCH_ROUNDS (alternating runs per side, median reported, default 3),
#      BERTH_BLOCKDEV_PASSTHROUGH (default true), BERTH_HEAL_CYCLES.
# Needs root, fio, losetup, FUSE. Targets are reported, not asserted.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="/usr/local/go/bin:$PATH"

out=$(mktemp)
trap 'rm -f "$out" "$out.heal" "$out.pvc" "$out.scale" "$out.share" "$out.ceph" "$out.keeper" "$out.memory"' EXIT

echo "== userspace / kernel loop device (fio direct=1, passthrough=${BERTH_BLOCKDEV_PASSTHROUGH:-true})"
BERTH_BLOCKDEV_PASSTHROUGH=${BERTH_BLOCKDEV_PASSTHROUGH:-true} \
	hack/bench-blockdev.sh "${BENCH_SECONDS:-10}" "${BENCH_SIZE:-1G}" | tee "$out"

echo
echo "== healing (${BERTH_HEAL_CYCLES:-50} cycles of SIGKILL agent + servers, 5 volumes with verifying writers)"
KUBEBUILDER_ASSETS=$(hack/kube-binaries.sh | tail -n 1)
export KUBEBUILDER_ASSETS
# The test's output goes to our stdout through a file: `tee /dev/stderr`
# would reopen, and so truncate, a log file that stderr is redirected to.
BERTH_HEAL_CYCLES=${BERTH_HEAL_CYCLES:-50} go test -trimpath -count=1 -v -timeout 60m \
	-run 'TestHealUnderWriters$' ./test/userspace/ 2>&1 | tee "$out.heal" && heal_rc=0 || heal_rc=$?
heal=$(grep '^HEAL_RESULT' "$out.heal" || true)
[ -n "$heal" ] || { echo "heal test printed no result" >&2; exit 1; }

# heal_scale PASSTHROUGH: one at-scale heal run; its HEAL_RESULT line goes
# to $out.scale.
: >"$out.scale"
heal_scale() {
	local log="$out.scale.$1"
	BERTH_BLOCKDEV_PASSTHROUGH=$1 BERTH_HEAL_VOLUMES=${BENCH_HEAL_SCALE_VOLUMES:-100} \
		BERTH_HEAL_CYCLES=${BENCH_HEAL_SCALE_CYCLES:-10} go test -trimpath -count=1 -v -timeout 60m \
		-run 'TestHealUnderWriters$' ./test/userspace/ >"$log" 2>&1 && r=0 || r=$?
	grep '^HEAL_RESULT' "$log" >>"$out.scale" || true
	if [ "$r" -ne 0 ]; then
		tail -n 40 "$log" >&2
		echo "heal at scale (passthrough=$1) FAILED (exit $r): its figures do not count" >&2
		heal_rc=$r
	fi
	rm -f "$log"
}
if [ "${BENCH_HEAL_SCALE:-1}" != 0 ]; then
	for p in true false; do
		echo
		echo "== healing at scale (${BENCH_HEAL_SCALE_VOLUMES:-100} volumes with writers, ${BENCH_HEAL_SCALE_CYCLES:-10} cycles, passthrough=$p)"
		heal_scale "$p"
		grep "passthrough=$p " "$out.scale" || true
	done
fi

keeper_rc=0
: >"$out.keeper"
if [ "${BENCH_KEEPER:-1}" != 0 ]; then
	echo
	echo "== keeper hand-over (${BERTH_KEEPER_HANDOVERS:-50} keeper replacements under verifying writers on 5 userspace volumes)"
	BERTH_KEEPER_HANDOVERS=${BERTH_KEEPER_HANDOVERS:-50} go test -trimpath -count=1 -v -timeout 30m \
		-run 'TestKeeperHandOverUnderWriters$' ./internal/blockdev/ >"$out.keeper" 2>&1 && keeper_rc=0 || keeper_rc=$?
	grep -E '^(KEEPER_HANDOVER_RESULT|--- |    keeper_handover)' "$out.keeper" || tail -n 40 "$out.keeper"
fi

echo
echo "== RWX failover (${BERTH_SHARE_FAILOVERS:-20} SIGKILLs of ganesha or the share manager under a writing NFSv4.0 and then NFSv4.1 client)"
BERTH_SHARE_FAILOVERS=${BERTH_SHARE_FAILOVERS:-20} go test -trimpath -count=1 -v -timeout 30m \
	-run 'TestFailoverLosesNoAcknowledgedWrite$' ./internal/cli/sharemanager/ 2>&1 | tee "$out.share" && share_rc=0 || share_rc=$?
share=$(grep '^SHARE_FAILOVER_RESULT' "$out.share" || true)

memory_rc=0
: >"$out.memory"
if [ "${BENCH_MEMORY:-1}" != 0 ]; then
	echo
	echo "== idle blockdev servers (${BENCH_MEMORY_VOLUMES:-10} local userspace volumes)"
	BERTH_MEMORY_BENCH=1 go test -trimpath -count=1 -v -timeout 10m -run 'TestIdleServerMemory$' ./test/userspace/ \
		>"$out.memory" 2>&1 && memory_rc=0 || memory_rc=$?
	grep -E '^(SERVER_MEMORY_RESULT|--- )' "$out.memory" || tail -n 40 "$out.memory"
fi

ceph_rc=0
: >"$out.ceph"
if [ "${BENCH_CEPH:-1}" != 0 ]; then
	echo
	echo "== Ceph: berth userspace volume vs rbd bench and rbd-fuse + loop"
	hack/bench-ceph.sh 2>&1 | tee "$out.ceph" && ceph_rc=0 || ceph_rc=$?
fi

pvc_rc=0
: >"$out.pvc"
if [ "${BENCH_PVC:-1}" != 0 ]; then
	echo
	echo "== PVC create -> pod Running (${BERTH_BENCH_PVCS:-20} at once per class, ${BENCH_NODES:-2}-node cluster), then RWX failover on a lapsed Lease (${BERTH_BENCH_LEASE_FAILOVERS:-20} rounds)"
	make --no-print-directory -s build
	BERTH_E2E_NODES=${BENCH_NODES:-2} BERTH_E2E_BENCH=1 BERTH_BENCH_PVCS=${BERTH_BENCH_PVCS:-20} \
		BERTH_BENCH_LEASE_FAILOVERS=${BERTH_BENCH_LEASE_FAILOVERS:-20} \
		hack/e2e.sh -run 'TestBench(PVCToRunning|ShareLeaseFailover)$' 2>&1 | tee "$out.pvc" && pvc_rc=0 || pvc_rc=$?
fi

echo
echo "== summary (targets are goals, not assertions)"
awk -v heal="$heal" '
function ms(d) { # Go duration -> milliseconds
	if (d ~ /ms$/) return d + 0; if (d ~ /µs$/) return d / 1000; if (d ~ /s$/) return d * 1000; return d
}
function row(name, val, target, ok) { printf "%-34s %10s   target %-8s %s\n", name, val, target, ok ? "met" : "MISSED" }
/QD64|QD16/ { n = split($0, f, " "); r = f[n - 3]; label = $0; sub(/ *\(.*/, "", label)
	row(label " ratio", r, ">= 0.8", r >= 0.8) }
/QD1 / { n = split($0, f, " "); x = f[n]; label = $0; sub(/ *\(.*/, "", label)
	row(label " latency x", x, "<= 2", x <= 2) }
END {
	split(heal, kv, " "); for (i in kv) { split(kv[i], p, "="); h[p[1]] = p[2] }
	row("heal time-to-write p50", h["p50"], "-", 1)
	row("heal time-to-write p99", h["p99"], "<= 5s", ms(h["p99"]) <= 5000)
	printf "%-34s %10s\n", "heal cycles x volumes (samples)", h["cycles"] "x" h["volumes"] " (" h["samples"] ")"
	printf "%-34s %10s   (writes %s, blocks verified %s)\n", "writer errors", h["errors"], h["writes"], h["verified"]
}' "$out"
awk '{
	for (i = 2; i <= NF; i++) { split($i, p, "="); v[p[1]] = p[2] }
	d = v["p99"]; ms = d ~ /ms$/ ? d + 0 : (d ~ /s$/ ? d * 1000 : d)
	printf "%-34s %10s   target %-8s %s\n", "heal at scale p99 (pt=" v["passthrough"] ")", d, "<= 1s", ms <= 1000 ? "met" : "MISSED"
	printf "%-34s %10s   (%s volumes x %s cycles, max %s, writer errors %s)\n", "heal at scale p50 (pt=" v["passthrough"] ")", v["p50"], v["volumes"], v["cycles"], v["max"], v["errors"]
}' "$out.scale"
echo "$share" | awk 'NF {
	for (i = 2; i <= NF; i++) { split($i, p, "="); v[p[1]] = p[2] }
	d = v["p99"]; ms = d ~ /ms$/ ? d + 0 : (d ~ /s$/ ? d * 1000 : d)
	printf "%-34s %10s   target %-8s %s\n", "RWX failover NFSv" v["nfs"] " p99", d, "<= 10s", ms <= 10000 ? "met" : "MISSED"
	printf "%-34s %10s   (%s failovers, max %s, %s files read back, lost %s)\n", "RWX failover NFSv" v["nfs"] " p50", v["p50"], v["failovers"], v["max"], v["files"], v["lost"]
}'
[ "$share_rc" -eq 0 ] || echo "RWX failover test FAILED (exit $share_rc): its figures do not count" >&2
grep '^KEEPER_HANDOVER_RESULT' "$out.keeper" | awk '{
	for (i = 2; i <= NF; i++) { split($i, p, "="); v[p[1]] = p[2] }
	d = v["p99"]; ms = d ~ /ms$/ ? d + 0 : (d ~ /µs$/ ? d / 1000 : (d ~ /s$/ ? d * 1000 : d))
	printf "%-34s %10s   target %-8s %s\n", "keeper hand-over stall p99", d, "<= 1s", ms <= 1000 ? "met" : "MISSED"
	printf "%-34s %10s   (%s hand-overs x %s volumes, %s server restarts, max %s, keeper alone max %s, between cycles p99 %s)\n", "keeper hand-over stall p50", v["p50"], v["cycles"], v["volumes"], v["restarts"], v["max"], v["keeper_max"], v["quiet_p99"]
	printf "%-34s %10s   (checksum failures %s, rounds %s)\n", "keeper hand-over writer errors", v["errors"], v["checksum"], v["rounds"]
}' || true
[ "$keeper_rc" -eq 0 ] || echo "keeper hand-over test FAILED (exit $keeper_rc): its figures do not count" >&2
grep '^PVC_RUNNING_RESULT' "$out.pvc" | awk '{
	for (i = 2; i <= NF; i++) { split($i, p, "="); v[p[1]] = p[2] }
	printf "%-34s %10s   p99 %s (%s PVCs, %s nodes)\n", "PVC -> Running p50 (" v["class"] ")", v["p50"], v["p99"], v["pvcs"], v["nodes"]
	if (v["p99_vs_emptydir"] != "" && v["p99_vs_emptydir"] != "-")
		printf "%-34s %10s   target %-8s %s\n", "PVC -> Running p99 / emptyDir (" v["class"] ")", v["p99_vs_emptydir"] "x", "<= 1.5x", v["p99_vs_emptydir"] + 0 <= 1.5 ? "met" : "MISSED"
}' || true
grep '^PVC_RUNNING_PHASES' "$out.pvc" | awk '{
	for (i = 2; i <= NF; i++) { split($i, p, "="); v[p[1]] = p[2] }
	printf "%-34s %10s   volumes+sandbox p99 %s, containers p99 %s\n", "  scheduled p99 (" v["class"] ")", v["scheduled_p99"], v["volumes_sandbox_p99"], v["containers_p99"]
}' || true
grep '^SHARE_LEASE_RESULT' "$out.pvc" | awk '{
	for (i = 2; i <= NF; i++) { split($i, p, "="); v[p[1]] = p[2] }
	d = v["p99"]; ms = d ~ /ms$/ ? d + 0 : (d ~ /s$/ ? d * 1000 : d)
	printf "%-34s %10s   target %-8s %s\n", "RWX failover, lapsed Lease p99", d, "<= 22s", ms <= 22000 ? "met" : "MISSED"
	printf "%-34s %10s   (%s failovers, Lease %s, max %s)\n", "RWX failover, lapsed Lease p50", v["p50"], v["failovers"], v["lease"], v["max"]
}' || true
cat "$out.memory" "$out.ceph" | grep '^SERVER_MEMORY_RESULT' | awk '{
	for (i = 2; i <= NF; i++) { split($i, p, "="); v[p[1]] = p[2] }
	printf "%-34s %10s   target %-8s %s\n", "idle server PSS (" v["kind"] ")", v["pss"], "<= 6MiB", v["pss"] + 0 <= 6 ? "met" : "MISSED"
	printf "%-34s %10s   (anonymous %s, threads %s; median of %s servers)\n", "idle server RSS (" v["kind"] ")", v["rss"], v["anon"], v["threads"], v["servers"]
}' || true
[ "$memory_rc" -eq 0 ] || echo "idle server memory (local) FAILED (exit $memory_rc): its figures do not count" >&2
sed -n '/^== Ceph: berth/,$p' "$out.ceph"
[ "$ceph_rc" -eq 0 ] || echo "Ceph bench FAILED (exit $ceph_rc): its figures do not count" >&2
[ "$pvc_rc" -eq 0 ] || echo "PVC / lapsed-Lease bench FAILED (exit $pvc_rc): its figures do not count" >&2
[ "$heal_rc" -eq 0 ] || { echo "heal test FAILED (exit $heal_rc): its figures above do not count" >&2; exit "$heal_rc"; }
[ "$share_rc" -eq 0 ] || exit "$share_rc"
[ "$keeper_rc" -eq 0 ] || exit "$keeper_rc"
[ "$memory_rc" -eq 0 ] || exit "$memory_rc"
[ "$ceph_rc" -eq 0 ] || exit "$ceph_rc"
exit "$pvc_rc"
