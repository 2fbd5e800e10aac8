#!/usr/bin/env bash
# The test Ceph of hack/ceph inside the e2e cluster's network: its daemons
# run in their own network namespace ($E2E_CEPH_NETNS), whose eth0
# ($E2E_CEPH_IP) hangs off the hub's node bridge like a node's, so that the
# nodes and their pods reach its monitor over the cluster network, as they
# would a real Ceph. In a cluster with multus (multus.sh) it hangs off the
# storage networks instead: eth0 ($E2E_CEPH_PUBLIC_IP) on the public
# bridge, eth1 ($E2E_CEPH_CLUSTER_IP, the OSDs' cluster_network) on the
# cluster bridge, so that only a storage interface reaches it. Its files
# live in $E2E_CEPH_DIR (inside the cluster's work dir).
#
#   hack/cluster/ceph.sh up       start it (idempotent); prints its ceph.env
#   hack/cluster/ceph.sh down     stop its daemons by PID, remove its folder, netns and veth
#   hack/cluster/ceph.sh env      print the path of its ceph.env (exit 1 if not up)
#   hack/cluster/ceph.sh ceph ARGS...   the ceph CLI as client.admin, in its netns
#                                 (e.g. `ceph.sh ceph osd blocklist ls`)
#   hack/cluster/ceph.sh leftovers  list what down left (hack/ceph/leftovers.sh + netns)
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=lib.sh
. "$HERE/lib.sh"

# With multus (up.sh made the storage networks: its mark is there), the
# test Ceph lives on them only, as behind a real storage network: public
# address on the public bridge, OSD replication on the cluster bridge, no
# link to the node network. Without, one address on the node bridge.
ceph_on_storage_networks() { [ -e "$MULTUS_MARK" ]; }

# hack/ceph's scripts, pointed at this cluster's folder, netns and addresses.
ceph_env=(BERTH_CEPH_DIR="$E2E_CEPH_DIR" BERTH_CEPH_NETNS="$E2E_CEPH_NETNS")
if ceph_on_storage_networks; then
	ceph_env+=(BERTH_CEPH_ADDR="$E2E_CEPH_PUBLIC_IP" BERTH_CEPH_CLUSTER_ADDR="$E2E_CEPH_CLUSTER_IP"
		BERTH_CEPH_PUBLIC_NETWORK="$PUBLIC_NET_PREFIX.0/24" BERTH_CEPH_CLUSTER_NETWORK="$CLUSTER_NET_PREFIX.0/24")
else
	ceph_env+=(BERTH_CEPH_ADDR="$E2E_CEPH_IP")
fi
hack_ceph() {
	local name=$1
	shift
	env "${ceph_env[@]}" "$HERE/../ceph/$name" "$@"
}

# ceph_link HUB_IF IF BRIDGE IP: a veth from BRIDGE in the hub to IF (IP/24)
# in the Ceph netns, up.
ceph_link() {
	local hub_if=$1 ifname=$2 bridge=$3 ip=$4
	ip -n "$NETNS" link show "$bridge" >/dev/null 2>&1 || die "no bridge $bridge in $NETNS: run hack/cluster/up.sh first"
	ip -n "$NETNS" link show "$hub_if" >/dev/null 2>&1 ||
		ip -n "$NETNS" link add "$hub_if" type veth peer name "$ifname" netns "$E2E_CEPH_NETNS"
	ip -n "$NETNS" link set "$hub_if" master "$bridge" up
	ip -n "$E2E_CEPH_NETNS" addr replace "$ip/24" dev "$ifname"
	ip -n "$E2E_CEPH_NETNS" link set "$ifname" up
}

# setup_net: the netns and its links. On the node bridge it routes back to
# every node's pod CIDR through that node (the hub forwards nothing), and
# nothing else: Ceph reaches only the node network. On the storage
# networks it needs no route: their /24s are on its links, and a client
# comes from a storage interface (a pod's, a holder's, the mover's copy).
setup_net() {
	local i
	[ -e "/run/netns/$NETNS" ] || die "no hub netns $NETNS: run hack/cluster/up.sh first"
	[ -e "/run/netns/$E2E_CEPH_NETNS" ] || { log "netns $E2E_CEPH_NETNS"; ip netns add "$E2E_CEPH_NETNS"; }
	ip -n "$E2E_CEPH_NETNS" link set lo up
	if ceph_on_storage_networks; then
		log "test Ceph on the storage networks: public $E2E_CEPH_PUBLIC_IP ($PUBLIC_BRIDGE), cluster $E2E_CEPH_CLUSTER_IP ($CLUSTER_BRIDGE)"
		ceph_link "$E2E_CEPH_PUBLIC_HUB_IF" eth0 "$PUBLIC_BRIDGE" "$E2E_CEPH_PUBLIC_IP"
		ceph_link "$E2E_CEPH_CLUSTER_HUB_IF" eth1 "$CLUSTER_BRIDGE" "$E2E_CEPH_CLUSTER_IP"
		return
	fi
	ceph_link "$E2E_CEPH_HUB_IF" eth0 "$HUB_BRIDGE" "$E2E_CEPH_IP"
	for i in $(node_indexes); do
		ip -n "$E2E_CEPH_NETNS" route replace "$(node_pod_cidr "$i")" via "$(node_ip "$i")"
	done
}

[ "$(id -u)" -eq 0 ] || die "run as root"
case "${1:-}" in
up)
	setup_net
	hack_ceph up.sh
	;;
down)
	hack_ceph down.sh
	if [ -e "/run/netns/$E2E_CEPH_NETNS" ]; then
		# down.sh stopped every daemon it started; anything else in the
		# netns is not ours by PID file, but lives only in our namespace.
		for pid in $(ip netns pids "$E2E_CEPH_NETNS" 2>/dev/null); do
			log "stopping pid $pid left in netns $E2E_CEPH_NETNS: $(tr '\0' ' ' 2>/dev/null <"/proc/$pid/cmdline" | cut -c1-80)"
			stop_pid "$pid" 5
		done
		log "deleting netns $E2E_CEPH_NETNS"
		ip netns del "$E2E_CEPH_NETNS"
	fi
	# Its veths went with the netns; hub ends left by a half-made up:
	for hub_if in "$E2E_CEPH_HUB_IF" "$E2E_CEPH_PUBLIC_HUB_IF" "$E2E_CEPH_CLUSTER_HUB_IF"; do
		if [ -e "/run/netns/$NETNS" ] && ip -n "$NETNS" link show "$hub_if" >/dev/null 2>&1; then
			ip -n "$NETNS" link del "$hub_if"
		fi
	done
	;;
env)
	[ -f "$E2E_CEPH_DIR/ceph.env" ] || die "no test Ceph in the cluster ($E2E_CEPH_DIR/ceph.env): hack/cluster/ceph.sh up"
	echo "$E2E_CEPH_DIR/ceph.env"
	;;
ceph)
	shift
	ip netns exec "$E2E_CEPH_NETNS" timeout 60 ceph -c "$E2E_CEPH_DIR/ceph.conf" -n client.admin --connect-timeout 30 "$@"
	;;
leftovers)
	rc=0
	hack_ceph leftovers.sh || rc=1
	if ip netns list | grep -qE "^$E2E_CEPH_NETNS( |$)"; then
		printf 'leftover netns:\n%s\n' "$E2E_CEPH_NETNS" >&2
		rc=1
	fi
	exit "$rc"
	;;
*) die "usage: $0 up|down|env|ceph ARGS...|leftovers" ;;
esac
