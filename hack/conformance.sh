#!/usr/bin/env bash
# The Kubernetes External Storage tests (k8s.io/kubernetes
# test/e2e/storage/external, the suite Kubernetes judges CSI drivers with)
# against berth: `berth dev up --demo=false` on two nodes (BERTH_E2E_NODES),
# then e2e.test once per
# StorageClass with its driver definition (test/conformance/<class>.yaml),
# and always `berth dev down` (which fails when anything was left behind).
# The classes of VM_CLASSES (berth-rwx: RWX claims, mounted by the kernel's
# NFS client, which this machine's kernel lacks) run after the others, on
# a cluster of their own: one netns node and one VM node (hack/vm), their
# pods on the VM node.
#
#   hack/conformance.sh              as root, after `make build`
#
# Environment:
#   CONFORMANCE_CLASSES  classes to test (default "berth berth-userspace
#                        berth-ceph-userspace berth-rwx"; a berth-ceph-*
#                        class brings up the test Ceph beside the local
#                        StorageCluster, berth-rwx a VM node)
#   CONFORMANCE_QUICK=1  a focused subset for CI, its classes at once (about
#                        6 minutes with the bring-up)
#   CONFORMANCE_SLOW=1   also the [Slow] specs (the fs-specific xfs patterns
#                        among them); they about double the run
#   CONFORMANCE_FOCUS    a regexp of specs to run instead (within External.Storage)
#   CONFORMANCE_SKIP     a regexp of specs to skip besides the standard skips
#   CONFORMANCE_PROCS    parallel Ginkgo processes (default 5: the specs mostly
#                        wait for pods and the API server)
#   BERTH_KEEP_CLUSTER=1 leave the cluster up for the next run (make test
#                        runs the e2e scenarios on it next); a cluster that
#                        is up already is reused
#
# Writes _output/conformance/<class>/junit_01.xml and prints, per class,
# passed / failed / skipped and the reason of every skip. Exit 1 when a
# spec failed. e2e.test and agnhost are built once into ~/.cache/berth.
set -euo pipefail
# The whole script is one function, read before it runs: editing this file
# during a run (which takes long) cannot change the running one.
main() {
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export PATH="/usr/local/go/bin:$PATH"
BERTH="${BERTH:-$PWD/bin/berth}"
OUT="$PWD/_output/conformance"
[ -x "$BERTH" ] || { echo "conformance: $BERTH missing: run make build" >&2; exit 1; }
[ "$(id -u)" -eq 0 ] || { echo "conformance: run as root (it brings up the e2e cluster)" >&2; exit 1; }
log() { printf '[conformance] %s\n' "$*" >&2; }
t0=$SECONDS

# Specs left out, and why. Everything else under External.Storage runs.
SKIPS=(
	# stop or restart kubelet and the node's services: need a disposable node
	'\[Disruptive\]'
	# cluster-wide stress, limits and performance: must run alone on a cluster
	'\[Serial\]'
	# features berth does not implement: SELinux mount (no SELinux here),
	# VolumeAttributesClass (no ControllerModifyVolume), volume group
	# snapshots (no CREATE_DELETE_GET_VOLUME_GROUP_SNAPSHOT), Windows nodes
	'\[Feature:(SELinux|VolumeAttributesClass|volumegroupsnapshot|Windows)\]'
)
if [ "${CONFORMANCE_SLOW:-}" != 1 ] && [ "${CONFORMANCE_QUICK:-}" != 1 ]; then
	# long specs, upstream's own split: run them with CONFORMANCE_SLOW=1
	SKIPS+=('\[Slow\]')
fi
# Limits of this machine, found at run time: each skips exactly the specs
# it breaks, and says so.
if ! nsenter --mount=/proc/1/ns/mnt -- true 2>/dev/null; then
	# The suite's host-exec pod lists kubelet's pod folders through
	# `nsenter --mount=/rootfs/proc/1/ns/mnt`; entering PID 1's mount
	# namespace is refused here (also to root on the host).
	log "skip: volumeMode 'should not mount / map unused volumes in a pod': nsenter into PID 1's mount namespace is refused on this machine"
	SKIPS+=('volumeMode should not mount / map unused volumes in a pod')
fi
cap_bounding=$(sed -n 's/^CapBnd:[[:space:]]*//p' /proc/self/status)
if [ $(((0x$cap_bounding >> 24) & 1)) -eq 0 ]; then
	# Online growth of a mounted ext4 (EXT4_IOC_RESIZE_FS) needs
	# CAP_SYS_RESOURCE, outside this machine's bounding set: berth answers
	# FailedPrecondition and grows it at the next stage (offline expansion
	# and online xfs and block growth still run).
	log "skip: online expansion of the default fs (ext4): CAP_SYS_RESOURCE is not in this machine's bounding set"
	SKIPS+=('\[Testpattern: Dynamic PV \(default fs\)\(allowExpansion\)\] volume-expand should resize volume when PVC is edited while pod is using it')
	SKIPS+=('\[Testpattern: Generic Ephemeral-volume \(default fs\).*\] ephemeral should support expansion of pvcs created for ephemeral pvcs')
fi
# The CI subset: one spec of each main path per class (provision + data,
# block, expansion offline and online, snapshot restore, clone, fsGroup).
QUICK_FOCUS='\[Testpattern: Dynamic PV \(default fs\)\] provisioning should provision storage with pvc data source$'
QUICK_FOCUS+='|\[Testpattern: Dynamic PV \(default fs\)\] volumes should store data$'
QUICK_FOCUS+='|\[Testpattern: Dynamic PV \(block volmode\)\] volumes should store data$'
QUICK_FOCUS+='|\[Testpattern: Dynamic PV \(default fs\)\(allowExpansion\)\] volume-expand Verify if offline PVC expansion works$'
QUICK_FOCUS+='|\[Testpattern: Dynamic PV \(xfs\)\] \[Slow\] volumes should store data$'
QUICK_FOCUS+='|\[Testpattern: Dynamic Snapshot \(retain policy\)\] snapshottable.*should check snapshot fields, check restore correctly works after modifying source data, check deletion \(persistent\)$'

classes=(${CONFORMANCE_CLASSES:-berth berth-userspace berth-ceph-userspace berth-rwx})
for c in "${classes[@]}"; do
	[ -f "test/conformance/$c.yaml" ] || { log "no driver definition test/conformance/$c.yaml"; exit 2; }
done
# Classes whose pods need a VM node's kernel; they run last, in a cluster
# of one netns node and one VM node.
VM_CLASSES=(berth-rwx)
vm_classes=()
keep=()
for c in "${classes[@]}"; do
	if [[ " ${VM_CLASSES[*]} " == *" $c "* ]]; then vm_classes+=("$c"); else keep+=("$c"); fi
done
classes=("${keep[@]}")
# The classes of the ceph StorageCluster berth-ceph (berth-ceph-*) need the
# test Ceph: `berth dev up --test-ceph` starts it in its own netns on the
# cluster's network (hack/cluster/ceph.sh, ~20 s) and `berth dev down`
# removes it. Where it cannot run, those classes skip, saying why.
ceph=()
ceph_classes=()
for c in "${classes[@]}"; do
	case $c in berth-ceph | berth-ceph-*) ceph_classes+=("$c") ;; esac
done
if [ "${#ceph_classes[@]}" -gt 0 ]; then
	no_ceph=
	# grep reads all of ldd's output: with -q it could exit first, and under
	# pipefail the SIGPIPE that ldd then gets read as "no librbd" (CI run 20).
	if ! ldd "$BERTH" 2>/dev/null | grep librbd >/dev/null; then
		no_ceph="$BERTH is built without the ceph backend (make build CEPH=0)"
	elif ! hack/install-deps.sh ceph-mon ceph-osd ceph-mgr ceph-common >&2; then
		no_ceph="the ceph packages (ceph-mon ceph-osd ceph-mgr ceph-common) are missing and could not be installed"
	fi
	if [ -z "$no_ceph" ]; then
		ceph=(--test-ceph)
	else
		log "skip: classes ${ceph_classes[*]}: $no_ceph: no test Ceph"
		keep=()
		for c in "${classes[@]}"; do
			case $c in berth-ceph | berth-ceph-*) ;; *) keep+=("$c") ;; esac
		done
		classes=("${keep[@]}")
		[ "${#classes[@]}" -gt 0 ] || [ "${#vm_classes[@]}" -gt 0 ] || exit 0
	fi
fi
focus='External.Storage'
if [ -n "${CONFORMANCE_FOCUS:-}" ]; then
	focus="External.Storage.*($CONFORMANCE_FOCUS)"
elif [ "${CONFORMANCE_QUICK:-}" = 1 ]; then
	focus="External.Storage.*($QUICK_FOCUS)"
fi

log "building e2e.test, agnhost and the summary tool (cached after the first run)"
KUBE_BIN=$(hack/kube-binaries.sh e2e.test agnhost ginkgo kubectl | tail -n1)
CGO_ENABLED=0 go build -trimpath -o "$PWD/bin/junit-summary" ./hack/junit-summary
rm -rf "$OUT"
mkdir -p "$OUT"

ginkgo_pids=()
finish() {
	local rc=$? p
	for p in "${ginkgo_pids[@]}"; do
		kill -0 "$p" 2>/dev/null || continue
		# interrupted: stop the suite's processes before the cluster goes
		pkill -KILL -P "$p" || true
		kill -KILL "$p" 2>/dev/null || true
	done
	if [ "${BERTH_KEEP_CLUSTER:-0}" = 1 ]; then
		log "BERTH_KEEP_CLUSTER=1: the cluster stays up"
	else
		"$BERTH" dev down --repo "$PWD" || rc=1
	fi
	log "done in $((SECONDS - t0))s (exit $rc)"
	exit "$rc"
}
trap finish EXIT
trap 'exit 130' INT TERM

repo_list="$OUT/repo-list.yaml"
echo "promoterE2eRegistry: berth.local/e2e-test-images" >"$repo_list"
failed=0
# phase NODES VM_NODES EXTRA_UP_ARGS... -- CLASS...: brings the cluster up
# in that shape (an up cluster of that shape is reused) and runs the classes.
phase() {
	local nodes=$1 vms=$2 up=() c def
	shift 2
	while [ "$1" != -- ]; do up+=("$1"); shift; done
	shift
	# The suite's pods run images of registry.k8s.io/e2e-test-images; up.sh
	# imports local builds of them under berth.local/e2e-test-images.
	BERTH_E2E_CONFORMANCE_IMAGES=1 "$BERTH" dev up --repo "$PWD" --demo=false --nodes "$nodes" --vm-nodes "$vms" "${up[@]}"
	log "cluster with berth up after $((SECONDS - t0))s ($nodes netns, $vms VM nodes)"
	ENV_FILE="${BERTH_E2E_DIR:-/var/lib/berth-e2e}/cluster.env"
	KUBECONFIG=$(sed -n 's/^KUBECONFIG=//p' "$ENV_FILE")
	local skips=("${SKIPS[@]}")
	if ! "$KUBE_BIN/kubectl" --kubeconfig "$KUBECONFIG" get volumesnapshotclass berth >/dev/null 2>&1; then
		# The definitions claim snapshots; a cluster without the snapshot CRDs,
		# snapshot-controller and the chart's class cannot run those specs.
		log "skip: [Feature:VolumeSnapshotDataSource]: the cluster has no VolumeSnapshotClass berth (snapshot CRDs, snapshot-controller)"
		skips+=('\[Feature:VolumeSnapshotDataSource\]')
	fi
	local skip
	skip=$(IFS='|'; echo "${skips[*]}")
	[ -z "${CONFORMANCE_SKIP:-}" ] || skip+="|$CONFORMANCE_SKIP"
	local vm_node=
	if [ "$vms" -gt 0 ]; then
		vm_node=$(sed -n 's/^NODE_KIND_\([0-9]*\)=vm$/\1/p' "$ENV_FILE" | head -n1)
		vm_node=$(sed -n "s/^NODE_NAME_$vm_node=//p" "$ENV_FILE")
		[ -n "$vm_node" ] || { log "no VM node in $ENV_FILE"; failed=1; return; }
	fi
	# The CI subset's classes run at once: a few specs each, which mostly
	# wait for pods and volumes (one after another they took 67, 64 and
	# 78 s). The whole suite's run one after another.
	local at_once=0 starts=()
	[ "${CONFORMANCE_QUICK:-}" != 1 ] || at_once=1
	ginkgo_pids=()
	for c in "$@"; do
		def="$PWD/test/conformance/$c.yaml"
		if [ -n "$vm_node" ]; then
			# The suite's pods go to the VM node: its kernel has the NFS client.
			def="$OUT/$c.yaml"
			{ cat "test/conformance/$c.yaml"; echo "ClientNodeName: $vm_node"; } >"$def"
		fi
		log "class $c: External Storage specs${vm_node:+ on VM node $vm_node} (focus ${focus:0:80}...)"
		starts+=("$(date +%s)")
		# ginkgo exits non-zero when a spec fails; the report says which.
		KUBE_TEST_REPO_LIST="$repo_list" "$KUBE_BIN/ginkgo" --procs "${CONFORMANCE_PROCS:-5}" \
			--focus "$focus" --skip "$skip" --timeout 2h --no-color -v \
			"$KUBE_BIN/e2e.test" -- \
			-kubeconfig "$KUBECONFIG" -kubectl-path "$KUBE_BIN/kubectl" \
			-storage.testdriver "$def" -report-dir "$OUT/$c" \
			>"$OUT/$c.log" 2>&1 &
		ginkgo_pids+=("$!")
		# In the background, so that a signal is handled at once.
		[ "$at_once" = 1 ] || { wait "$!" || true; class_report "$c" "${starts[-1]}"; }
	done
	local i=0
	for c in "$@"; do
		[ "$at_once" = 1 ] || break
		wait "${ginkgo_pids[$i]}" || true
		class_report "$c" "${starts[$i]}"
		i=$((i + 1))
	done
	ginkgo_pids=()
}

# class_report CLASS START: a class's time (START in epoch seconds, its end
# its log's last write) and summary.
class_report() {
	local c=$1 start=$2
	log "class $c: finished in $(($(stat -c %Y "$OUT/$c.log") - start))s, log $OUT/$c.log"
	if ! "$PWD/bin/junit-summary" -class "$c" "$OUT/$c/junit_01.xml"; then
		failed=1
		# The next run of this script empties $OUT: say here why.
		grep -E '\[FAILED\]|[Tt]imed out|error:' "$OUT/$c.log" | head -20 | sed 's/^/  /' || true
	fi
}
if [ "${#classes[@]}" -gt 0 ]; then
	phase "${BERTH_E2E_NODES:-2}" 0 "${ceph[@]}" -- "${classes[@]}"
	if [ "${#vm_classes[@]}" -gt 0 ]; then
		# Another shape: this cluster goes first.
		"$BERTH" dev down --repo "$PWD" || failed=1
	fi
fi
if [ "${#vm_classes[@]}" -gt 0 ]; then
	phase 1 1 -- "${vm_classes[@]}"
fi
exit "$failed"
}
main "$@"
