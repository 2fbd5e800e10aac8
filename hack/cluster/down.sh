#!/usr/bin/env bash
# Stops the e2e cluster of hack/cluster/up.sh and removes every process,
# mount, loop device, cgroup, namespace, interface and sysctl change it made.
# Idempotent: a second run finds nothing and says so.
#
#   hack/cluster/down.sh [--purge]   --purge also deletes certificates,
#                                    images and logs (the whole work dir)
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=lib.sh
. "$HERE/lib.sh"

[ "$(id -u)" -eq 0 ] || die "run as root"
purge=
[ "${1:-}" = --purge ] && purge=1
t0=$SECONDS
KUBECTL=
[ -f "$WORKDIR/kube-bin" ] && KUBECTL="$(cat "$WORKDIR/kube-bin")/kubectl"

"$HERE/snapshots.sh" down # its Deployment, so that no pod comes back
# 1. Pods first, through the API, while kubelet still runs: kubelet then
#    unmounts their volumes and tears their sandboxes down properly.
if [ -x "$KUBECTL" ] && pid_of kubelet >/dev/null && kctl get --raw /readyz >/dev/null 2>&1; then
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

# 2. kubelet, then whatever containers remain, then containerd.
if pid=$(pid_of kubelet); then log "stopping kubelet ($pid)"; stop_pid "$pid"; fi
if pid_of containerd >/dev/null; then
	ctr_() { ctr -a "$CONTAINERD_SOCK" -n k8s.io "$@"; }
	for id in $(ctr_ tasks ls -q 2>/dev/null); do
		log "killing container task $id"
		ctr_ tasks kill -s SIGKILL "$id" >/dev/null 2>&1 || true
		for ((i = 0; i < 50; i++)); do ctr_ tasks rm "$id" >/dev/null 2>&1 && break; sleep 0.1; done
	done
	for id in $(ctr_ containers ls -q 2>/dev/null); do ctr_ containers rm "$id" >/dev/null 2>&1 || true; done
fi
# containerd lingers ~7s after "Stop CRI service"; its state is discarded.
if pid=$(pid_of containerd); then log "stopping containerd ($pid)"; stop_pid "$pid" 3; fi

# 3. Leftovers of a crash: shims serving our socket, processes in our pod
#    cgroups. Matching the socket path and cgroup name, never a program name.
shims=$(procs_matching "-address $CONTAINERD_SOCK" | cut -d' ' -f1)
for pid in $shims; do log "stopping shim $pid"; stop_pid "$pid" 3; done
cgroup_pids() {
	local c
	for c in /sys/fs/cgroup/*/"$CGROUP_NAME"; do
		if [ -d "$c" ]; then find "$c" -name cgroup.procs -exec cat {} + 2>/dev/null; fi
	done | sort -un
}
# Repeat: a shell loop may fork a new child between listing and killing.
for ((round = 0; round < 50; round++)); do
	pids=$(cgroup_pids)
	[ -z "$pids" ] && break
	[ "$round" -eq 0 ] && log "killing pod processes left in cgroup $CGROUP_NAME: $(echo $pids)"
	kill -KILL $pids 2>/dev/null || true
	sleep 0.1
done

# 4. Control plane, newest first, then anything else left in our netns.
for name in kube-scheduler kube-controller-manager kube-apiserver etcd; do
	if pid=$(pid_of "$name"); then log "stopping $name ($pid)"; stop_pid "$pid"; fi
done
if [ -e "/run/netns/$NETNS" ]; then
	for pid in $(ip netns pids "$NETNS" 2>/dev/null); do
		log "stopping pid $pid left in netns $NETNS: $(tr '\0' ' ' 2>/dev/null <"/proc/$pid/cmdline" | cut -c1-80)"
		stop_pid "$pid" 5
	done
fi
rm -f "$PIDS"/*.pid 2>/dev/null || true

# 5. Mounts (pod volumes, container rootfs, sandbox netns and shm, kubelet's
#    rshared root), deepest first; then loop devices on our files.
roots=("$WORKDIR")
case "$KUBELET_ROOT" in "$WORKDIR"/*) ;; *) roots+=("$KUBELET_ROOT") ;; esac
roots+=("$BERTH_RUN_DIR")
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
	for r in "${roots[@]}"; do
		case "$back" in "$r"/*) log "detaching $dev ($back)"; losetup -d "$dev" || true ;; esac
	done
done < <(losetup -nl -O NAME,BACK-FILE 2>/dev/null)

# 6. Cgroups (deepest first), netns and veth.
for c in /sys/fs/cgroup/*/"$CGROUP_NAME"; do
	[ -d "$c" ] && find "$c" -depth -type d -exec rmdir {} + 2>/dev/null || true
	[ -d "$c" ] && log "warning: cgroup $c still in use"
done
if ip link show "$HOST_IF" >/dev/null 2>&1; then log "deleting veth $HOST_IF"; ip link del "$HOST_IF"; fi
if [ -e "/run/netns/$NETNS" ]; then log "deleting netns $NETNS"; ip netns del "$NETNS"; fi

# 7. Sysctls kubelet changed, back to what they were before the first up.
if [ -f "$SYSCTL_SAVED" ]; then
	while IFS= read -r kv; do
		[ "$(sysctl -n "${kv%%=*}")" = "${kv#*=}" ] || { log "restoring $kv"; sysctl -qw "$kv"; }
	done <"$SYSCTL_SAVED"
	rm -f "$SYSCTL_SAVED"
fi

# 8. Host files: the CNI result cache of our network, kubelet's log links
#    into our pod logs, and folders that did not exist before the first up.
# The CNI cache of sandboxes that were never torn down (a crash), found by
# the sandbox IDs containerd recorded.
rm -f /var/lib/cni/results/berth-e2e-* 2>/dev/null || true
for d in "$CONTAINERD_DIR"/*/io.containerd.grpc.v1.cri/sandboxes/*/; do
	[ -d "$d" ] && rm -f "/var/lib/cni/results/cni-loopback-$(basename "$d")-lo"
done
if [ -d /var/log/containers ]; then
	find /var/log/containers -maxdepth 1 -type l -lname "$POD_LOGS/*" -delete
fi
if [ -f "$HOST_CREATED" ]; then
	# Paths that cannot go yet stay listed, for the next down to retry.
	while IFS= read -r p; do
		[ "$p" = /var/lib/kubelet ] && rm -f /var/lib/kubelet/device-plugins/kubelet.sock
		# The sockets of berth's agent and keeper, whose pods are gone.
		[ "$p" = "$BERTH_RUN_DIR" ] && find "$p" -maxdepth 1 -type s -delete
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

# 9. Runtime state. Never rm across a mount point: refuse if any is left.
if [ -n "$(mounts_under "${roots[@]}")" ]; then
	die "mounts remain under ${roots[*]}; state not removed"
fi
if [ -d "$WORKDIR" ]; then
	# A kubelet root or plugin dir outside the work dir may be shared: kept.
	rm -rf --one-file-system "$WORKDIR/etcd" "$CONTAINERD_DIR" "$CNI_DIR" "$POD_LOGS" "$PIDS" "$WORKDIR/cluster.env"
	for d in "$KUBELET_ROOT" "$VOLUME_PLUGIN_DIR"; do
		case "$d" in "$WORKDIR"/*) rm -rf --one-file-system "$d" ;; esac
	done
	[ -z "$purge" ] || rm -rf --one-file-system "$WORKDIR"
fi
log "down in $((SECONDS - t0))s"
