#!/usr/bin/env bash
# Simulates the loss of one node of the e2e cluster, and undoes it.
#
#   hack/cluster/node.sh NODE stop|start|freeze|thaw|cut|restore|status|poweroff|boot
#
# NODE is a node's name (berth-e2e-node-2) or index (2).
#   stop     SIGKILL everything of the node (kubelet, containerd, its shims,
#            its pods' processes: all of its cgroup), as a power loss would;
#            its mounts and loop devices stay (the kernel is shared)
#   start    start containerd, kubelet and kube-proxy again, wait for the
#            node Ready
#   freeze   freeze all of the node's processes (cgroup freezer): a hung node
#   thaw     undo freeze
#   cut      take the node's links to the hub down: no API server, no peers,
#            no storage network
#   restore  undo cut
#   status   print running/frozen/stopped and linked/cut
# A VM node (BERTH_E2E_VM_NODES, hack/vm) has its own kernel:
#   poweroff SIGKILL its qemu: kernel, mounts, devices and page cache gone
#            at once; its disk keeps what reached it
#   boot     start qemu again on the same disk, wait for the node Ready
#   stop     SIGKILL kubelet, containerd, kube-proxy, shims and pods inside
#            it (cgroup.kill); its kernel and mounts stay
#   start    start them again (boots the VM if it is off), wait Ready
#   freeze   SIGSTOP its qemu: the whole machine hangs; thaw: SIGCONT
#   status   also "off" when qemu does not run
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
# shellcheck source=lib.sh
. "$HERE/lib.sh"
. "$HERE/nodes.sh"
# shellcheck source=dns.sh
. "$HERE/dns.sh"
. "$HERE/images.sh"
# shellcheck source=../vm/vm.sh
. "$REPO/hack/vm/vm.sh"

[ $# -eq 2 ] || die "usage: $0 NODE stop|start|freeze|thaw|cut|restore|status|poweroff|boot"
[ "$(id -u)" -eq 0 ] || die "run as root"
[ -s "$NODES_LIST" ] || die "no cluster in $WORKDIR (hack/cluster/up.sh)"
i=$(node_index "$1") || die "no node $1 (nodes: $(for i in $(node_indexes); do node_name "$i"; done | tr '\n' ' '))"
name=$(node_name "$i")
KUBE_BIN=$(cat "$WORKDIR/kube-bin")
KUBECTL="$KUBE_BIN/kubectl"
hubif=$(node_hub_if "$i")

if node_is_vm "$i"; then
	case $2 in
	poweroff)
		vm_poweroff "$i"
		log "$name powered off"
		exit 0
		;;
	boot | start)
		# start of a VM that runs only starts its daemons again.
		vm_start_node "$i"
		vm_wait_ready "$i"
		exit 0
		;;
	stop)
		vm_running "$i" || die "$name is powered off"
		vm_exec "$i" berth-node stop
		log "$name stopped (kubelet, containerd, kube-proxy, pods; its kernel runs)"
		exit 0
		;;
	freeze | thaw)
		pid=$(pid_of "qemu@$i") || die "$name is powered off"
		if [ "$2" = freeze ]; then
			kill -STOP "$pid"
			log "$name frozen (qemu $pid stopped)"
		else
			kill -CONT "$pid"
			log "$name thawed (qemu $pid)"
		fi
		exit 0
		;;
	status)
		state=off
		if pid=$(pid_of "qemu@$i"); then
			state=stopped
			if grep -q '^State:.*T' "/proc/$pid/status"; then
				state=frozen
			elif VM_EXEC_TIMEOUT=30 vm_exec "$i" berth-node status 2>/dev/null | grep -q 'kubelet=running'; then
				state=running
			fi
		fi
		link=linked
		ip -n "$NETNS" link show "$hubif" 2>/dev/null | grep -q 'state UP\|,UP' || link=cut
		echo "$name $state $link"
		exit 0
		;;
	esac
	# cut and restore: its tap is $hubif, as a netns node's veth.
fi

case $2 in
poweroff | boot) die "$name is not a VM node: $2 needs one (BERTH_E2E_VM_NODES); stop/start for this one" ;;
stop)
	node_kill "$i"
	rm -f "$PIDS/kubelet-$name.pid" "$PIDS/containerd-$name.pid" "$PIDS/kube-proxy-$name.pid"
	log "$name stopped"
	;;
start)
	node_thaw "$i"
	start_node "$i"
	# kube-proxy died with the node (it runs in the node's cgroup): a real
	# node's comes back with it. Without it the node's Service rules stay
	# as they were at the loss, pointing at pods that are gone (a pod there
	# then gets no answer from cluster DNS).
	start_kube_proxy "$name" "$(node_netns "$i")" "$(node_ip "$i")" "$(node_freezer "$i")/daemons"
	wait_node_ready "$i"
	# A node whose kube-proxy died has stale Service rules: say so here,
	# not as a DNS timeout in whatever test runs next.
	pid_of "kube-proxy-$name" >/dev/null || die "kube-proxy of $name exited (log: $LOGS/kube-proxy-$name.log)"
	;;
freeze)
	node_freeze "$i"
	log "$name frozen"
	;;
thaw)
	node_thaw "$i"
	log "$name thawed"
	;;
cut)
	# Its storage networks' links too, where multus gave it some.
	for l in "$hubif" "$(node_public_hub_if "$i")" "$(node_cluster_hub_if "$i")"; do
		ip -n "$NETNS" link show "$l" >/dev/null 2>&1 && ip -n "$NETNS" link set "$l" down
	done
	log "$name cut off the hub"
	;;
restore)
	for l in "$hubif" "$(node_public_hub_if "$i")" "$(node_cluster_hub_if "$i")"; do
		ip -n "$NETNS" link show "$l" >/dev/null 2>&1 && ip -n "$NETNS" link set "$l" up
	done
	log "$name linked to the hub again"
	;;
status)
	state=running
	pid_of "kubelet@$i" >/dev/null || state=stopped
	if [ "$(cat "$(node_freezer "$i")/freezer.state" 2>/dev/null)" = FROZEN ]; then state=frozen; fi
	link=linked
	ip -n "$NETNS" link show "$hubif" 2>/dev/null | grep -q 'state UP\|,UP' || link=cut
	echo "$name $state $link"
	;;
*) die "unknown action $2" ;;
esac
