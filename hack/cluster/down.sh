#!/usr/bin/env bash
# Stops the e2e cluster of hack/cluster/up.sh and removes every process,
# mount (in every node's mount namespace too), mount namespace, loop device,
# cgroup, network namespace, interface and sysctl change it made.
# Idempotent: a second run finds nothing and says so.
#
#   hack/cluster/down.sh [--purge]   --purge also deletes certificates,
#                                    images and logs (the whole work dir)
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=lib.sh
. "$HERE/lib.sh"
. "$HERE/nodes.sh"
. "$HERE/dns.sh"
# shellcheck source=../vm/vm.sh
. "$HERE/../vm/vm.sh"

[ "$(id -u)" -eq 0 ] || die "run as root"
purge=
[ "${1:-}" = --purge ] && purge=1
t0=$SECONDS
KUBECTL=
[ -f "$WORKDIR/kube-bin" ] && KUBECTL="$(cat "$WORKDIR/kube-bin")/kubectl"

"$HERE/snapshots.sh" down # its Deployment, so that no pod comes back
# 1. Pods first, through the API, while kubelets still run: they then
#    unmount their volumes and tear their sandboxes down properly.
kubelets_run=
for i in $(node_indexes); do pid_of "kubelet@$i" >/dev/null && kubelets_run=1; done
for i in $(vm_indexes); do vm_running "$i" && kubelets_run=1; done
if [ -x "$KUBECTL" ] && [ -n "$kubelets_run" ] && kctl get --raw /readyz >/dev/null 2>&1; then
	for i in $(node_indexes); do node_thaw "$i"; done
	remove_coredns
	if [ -n "$(kctl get pods -A -o name 2>/dev/null)" ]; then
		log "deleting every pod (kubelet unmounts their volumes)"
		kctl delete pods -A --all --grace-period=5 --wait=false >/dev/null 2>&1 || true
		for ((i = 0; i < 60; i++)); do
			[ -z "$(kctl get pods -A -o name 2>/dev/null)" ] && break
			((i % 5 == 4)) && log "  still waiting for pods to go ($((i + 1))s)"
			sleep 1
		done
	fi
fi

# 2. kube-proxies; per node: kubelet, the containers, containerd, then
#    whatever is left in the node's cgroup (pods of a stopped kubelet, shims).
for i in $(node_indexes); do node_thaw "$i"; done # a frozen process ignores SIGTERM
stop_kube_proxies
# VM nodes: qemu killed by its PID (their pods were deleted above), tap and
# disk removed; the cached image stays unless --purge.
for i in $(vm_indexes); do vm_remove "$i"; done
for i in $(node_indexes); do node_is_vm "$i" || stop_node_daemons "$i"; done
# Pod processes of an older layout, directly below the cgroup root.
for ((round = 0; round < 50; round++)); do
	pids=$(for c in /sys/fs/cgroup/*/"$CGROUP_NAME"; do
		if [ -d "$c" ]; then find "$c" -name cgroup.procs -exec cat {} + 2>/dev/null; fi
	done | sort -un)
	[ -z "$pids" ] && break
	[ "$round" -eq 0 ] && log "killing processes left in cgroup $CGROUP_NAME: $(echo $pids)"
	kill -KILL $pids 2>/dev/null || true
	sleep 0.1
done

# 3. Control plane, newest first, then anything else left in our netns.
for name in kube-scheduler kube-controller-manager kube-apiserver etcd; do
	if pid=$(pid_of "$name"); then log "stopping $name ($pid)"; stop_pid "$pid"; fi
done
for ns in "$NETNS" $(for i in $(node_indexes); do node_netns "$i"; done); do
	[ -e "/run/netns/$ns" ] || continue
	for pid in $(ip netns pids "$ns" 2>/dev/null); do
		log "stopping pid $pid left in netns $ns: $(tr '\0' ' ' 2>/dev/null <"/proc/$pid/cmdline" | cut -c1-80)"
		stop_pid "$pid" 5
	done
done
rm -f "$PIDS"/*.pid 2>/dev/null || true
# The test Ceph (ceph.sh), once no node is left to use it: its daemons by
# their PIDs, its folder, netns and veth. What it cannot remove,
# leftovers.sh reports.
"$HERE/ceph.sh" down || log "warning: the test Ceph was not removed cleanly (hack/cluster/ceph.sh leftovers)"

# 4. Each node's mounts (pod volumes, container rootfs, sandbox netns and
#    shm, berth's folders, the node binds), deepest first, inside its mount
#    namespace; its loop devices; then the namespace. Then the host's.
for i in $(node_indexes); do teardown_node_mounts "$i"; done
# Namespace files of nodes no longer listed (an interrupted up).
for f in "$MNTNS_DIR"/*; do
	if [ -e "$f" ] && grep -qF " $f " /proc/self/mountinfo; then
		log "releasing mount namespace $f"
		umount "$f" || umount -l "$f" || true
	fi
done
roots=("$WORKDIR" "$BERTH_RUN_DIR")
for round in 1 2 3; do
	mapfile -t mounts < <(mounts_under "${roots[@]}")
	[ ${#mounts[@]} -eq 0 ] && break
	for m in "${mounts[@]}"; do
		if [ "$round" -lt 3 ]; then
			umount "$m" 2>/dev/null && log "unmounted $m" || true
		else
			log "busy mount $m: lazy unmount"
			umount -l "$m" || true
		fi
	done
done
while read -r dev back; do
	for r in "${roots[@]}" "$KUBELET_ROOT"; do
		case "$back" in "$r"/*) log "detaching $dev ($back)"; losetup -d "$dev" || true ;; esac
	done
	# A userspace volume's file once its FUSE mount is gone reads as the
	# bare /disk.img: only berth makes those, and no node is left to own it.
	case "$back" in /disk.img | "/disk.img (deleted)")
		log "warning: $dev is still on a userspace volume's file after every node went (a leak): detaching it"
		losetup -d "$dev" || true
		;;
	esac
done < <(losetup -nl -O NAME,BACK-FILE 2>/dev/null)

# 5. Cgroups (deepest first), netns, veths and the hub bridge (they go
#    with their namespaces).
for c in /sys/fs/cgroup/*/"$CGROUP_NAME"; do
	[ -d "$c" ] && find "$c" -depth -type d -exec rmdir {} + 2>/dev/null || true
	[ -d "$c" ] && log "warning: cgroup $c still in use"
done
for i in $(node_indexes); do
	ns=$(node_netns "$i")
	if [ -e "/run/netns/$ns" ]; then log "deleting netns $ns"; ip netns del "$ns"; fi
done
if ip link show "$HOST_IF" >/dev/null 2>&1; then log "deleting veth $HOST_IF"; ip link del "$HOST_IF"; fi
if [ -e "/run/netns/$NETNS" ]; then log "deleting netns $NETNS"; ip netns del "$NETNS"; fi

# 5b. Sysctls kubelet changed, back to what they were before the first up.
if [ -f "$SYSCTL_SAVED" ]; then
	while IFS= read -r kv; do
		[ "$(sysctl -n "${kv%%=*}")" = "${kv#*=}" ] || { log "restoring $kv"; sysctl -qw "$kv"; }
	done <"$SYSCTL_SAVED"
	rm -f "$SYSCTL_SAVED"
fi

# 6. Host files: folders that did not exist before the first up (the
#    nodes' mount points; their content lived in the nodes' folders).
if [ -f "$HOST_CREATED" ]; then
	# Paths that cannot go yet stay listed, for the next down to retry.
	while IFS= read -r p; do
		# Empty: no other netns lives there; `ip netns add` remakes it.
		if mountpoint -q "$p" && [ -z "$(ls -A "$p")" ]; then umount "$p" || true; fi
		[ -d "$p" ] && find "$p" -depth -type d -empty -delete 2>/dev/null || true
		if [ -e "$p" ]; then
			log "warning: $p (made by the cluster) is not empty; left in place"
			echo "$p"
		fi
	done <"$HOST_CREATED" >"$HOST_CREATED.tmp"
	if [ -s "$HOST_CREATED.tmp" ]; then mv "$HOST_CREATED.tmp" "$HOST_CREATED"; else rm -f "$HOST_CREATED" "$HOST_CREATED.tmp"; fi
fi

# 7. Runtime state. Never rm across a mount point: refuse if any is left.
if [ -n "$(mounts_under "${roots[@]}")" ]; then
	die "mounts remain under ${roots[*]}; state not removed"
fi
if [ -d "$WORKDIR" ]; then
	# A kubelet root or plugin dir outside the work dir may be shared: kept.
	rm -rf --one-file-system "$WORKDIR/etcd" "$NODES_DIR" "$MNTNS_DIR" "$PIDS" "$WORKDIR/cluster.env" "$NODES_LIST" \
		"$VM_NODES_LIST" "$VM_IMAGE_FILE" \
		"$BERTH_DATA_DIR" "$VOLUME_PLUGIN_DIR" "$WORKDIR/berth-data-ceph" "$CNI_BIN_DIR" "$MULTUS_MARK"
	# Layout of the single-node cluster (an old work dir).
	rm -rf --one-file-system "$WORKDIR/containerd" "$WORKDIR/cni" "$WORKDIR/pod-logs" "$WORKDIR/kubelet"
	[ -z "$purge" ] || rm -rf --one-file-system "$WORKDIR"
fi
if [ -n "$purge" ] && [ -d "$VM_CACHE" ]; then
	log "removing the VM images in $VM_CACHE"
	rm -rf --one-file-system "$VM_CACHE"
fi
log "down in $((SECONDS - t0))s"
