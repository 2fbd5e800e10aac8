#!/usr/bin/env bash
# The test Ceph of hack/ceph inside the e2e cluster's network: its daemons
# run in their own network namespace ($E2E_CEPH_NETNS), whose eth0
# ($E2E_CEPH_IP) hangs off the hub's node bridge like a node's, so that the
# nodes and their pods reach its monitor over the cluster network, as they
# would a real Ceph. Its files live in $E2E_CEPH_DIR (inside the cluster's
# work dir).
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

# hack/ceph's scripts, pointed at this cluster's folder, netns and address.
ceph_env=(BERTH_CEPH_DIR="$E2E_CEPH_DIR" BERTH_CEPH_NETNS="$E2E_CEPH_NETNS" BERTH_CEPH_ADDR="$E2E_CEPH_IP")
hack_ceph() {
	local name=$1
	shift
	env "${ceph_env[@]}" "$HERE/../ceph/$name" "$@"
}

# setup_net: the netns, its veth on the hub bridge, and routes back to
# every node's pod CIDR through that node (the hub forwards nothing).
# Nothing else is routed: Ceph reaches only the node network.
setup_net() {
	local i
	[ -e "/run/netns/$NETNS" ] || die "no hub netns $NETNS: run hack/cluster/up.sh first"
	[ -e "/run/netns/$E2E_CEPH_NETNS" ] || { log "netns $E2E_CEPH_NETNS ($E2E_CEPH_IP)"; ip netns add "$E2E_CEPH_NETNS"; }
	ip -n "$E2E_CEPH_NETNS" link set lo up
	ip -n "$NETNS" link show "$E2E_CEPH_HUB_IF" >/dev/null 2>&1 ||
		ip -n "$NETNS" link add "$E2E_CEPH_HUB_IF" type veth peer name eth0 netns "$E2E_CEPH_NETNS"
	ip -n "$NETNS" link set "$E2E_CEPH_HUB_IF" master "$HUB_BRIDGE" up
	ip -n "$E2E_CEPH_NETNS" addr replace "$E2E_CEPH_IP/24" dev eth0
	ip -n "$E2E_CEPH_NETNS" link set eth0 up
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
	# Its veth went with the netns; a hub end left by a half-made up:
	if [ -e "/run/netns/$NETNS" ] && ip -n "$NETNS" link show "$E2E_CEPH_HUB_IF" >/dev/null 2>&1; then
		ip -n "$NETNS" link del "$E2E_CEPH_HUB_IF"
	fi
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
