# Shared settings of hack/ceph/*.sh (sourced, not run). Every name, address,
# port and folder the test Ceph uses is here, overridable through the
# environment, so that up, down and leftovers always agree on what they own.

# shellcheck source=../lib/procs.sh
. "$(dirname "${BASH_SOURCE[0]}")/../lib/procs.sh"

CEPH_DIR="${BERTH_CEPH_DIR:-/var/lib/berth-ceph}"
# The address every daemon binds and clients dial. BERTH_CEPH_NETNS (a
# network namespace the caller made, its lo up and CEPH_ADDR on one of its
# interfaces) runs the daemons and up.sh's own ceph commands inside it.
CEPH_ADDR="${BERTH_CEPH_ADDR:-127.0.0.1}"
CEPH_NETNS="${BERTH_CEPH_NETNS:-}"
# The OSDs' replication address (cluster_addr), on an interface of the
# netns too: by default the public address (one network). With
# BERTH_CEPH_PUBLIC_NETWORK and BERTH_CEPH_CLUSTER_NETWORK (CIDRs holding
# the two addresses) the daemons also get public_network/cluster_network,
# so that replication between OSDs stays on the cluster network.
CEPH_CLUSTER_ADDR="${BERTH_CEPH_CLUSTER_ADDR:-$CEPH_ADDR}"
CEPH_PUBLIC_NETWORK="${BERTH_CEPH_PUBLIC_NETWORK:-}"
CEPH_CLUSTER_NETWORK="${BERTH_CEPH_CLUSTER_NETWORK:-}"
# The monitor speaks msgr2 only (every client berth uses is Pacific or newer).
MON_PORT="${BERTH_CEPH_MON_PORT:-3300}"
# mgr and OSDs bind ports in this range (each OSD takes four).
PORT_MIN="${BERTH_CEPH_PORT_MIN:-6800}"
PORT_MAX="${BERTH_CEPH_PORT_MAX:-6899}"
POOL="${BERTH_CEPH_POOL:-berth}"
PG_NUM="${BERTH_CEPH_PG_NUM:-16}"
CLIENT="${BERTH_CEPH_CLIENT:-berth}"
# The nodes' client (the node-stage secret's): `profile rbd` alone.
NODE_CLIENT="$CLIENT-node"
OSD_COUNT=3
# Bluestore's block file per OSD (sparse; only written blocks take space).
OSD_BLOCK_SIZE="${BERTH_CEPH_OSD_BLOCK_SIZE:-$((4 << 30))}"
# Every wait gives up after this many seconds.
WAIT="${BERTH_CEPH_WAIT:-120}"

CONF="$CEPH_DIR/ceph.conf"
# What clients use: monitors and the berth client's keyring, no admin key.
# Named ceph.conf in its own folder: the ceph CLI takes the cluster name from
# the file name (and would look for "client.client.berth.keyring").
CLIENT_CONF="$CEPH_DIR/client/ceph.conf"
ENV_FILE="$CEPH_DIR/ceph.env"
ADMIN_KEYRING="$CEPH_DIR/keyring/client.admin.keyring"
CLIENT_KEYRING="$CEPH_DIR/keyring/client.$CLIENT.keyring"
NODE_KEYRING="$CEPH_DIR/keyring/client.$NODE_CLIENT.keyring"
PIDS="$CEPH_DIR/pids"
LOGS="$CEPH_DIR/log"
# Written last by a complete bootstrap: without it the folder is half made.
READY="$CEPH_DIR/bootstrapped"

# Daemons in start order: "type.id".
DAEMONS=(mon.a mgr.x)
for ((i = 0; i < OSD_COUNT; i++)); do DAEMONS+=("osd.$i"); done

export PATH="/usr/local/sbin:/usr/sbin:/sbin:$PATH"

log() { printf '[ceph %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() {
	log "error: $*"
	exit 1
}

# in_ns CMD...: CMD in CEPH_NETNS when set. `ip netns exec` execs CMD, so
# the PID stays the daemon's.
in_ns() {
	if [ -n "$CEPH_NETNS" ]; then
		ip netns exec "$CEPH_NETNS" "$@"
	else
		"$@"
	fi
}

# admin ARGS...: the ceph CLI as client.admin, bounded in time.
admin() { in_ns timeout 60 ceph -c "$CONF" -n client.admin --connect-timeout 30 "$@"; }

# pid_of DAEMON prints the recorded PID of DAEMON (e.g. osd.1) if that
# process still runs the recorded binary.
pid_of() { pidfile_pid "$PIDS/$1.pid"; }

# wait_for WHAT CMD...: runs CMD every half second until it succeeds; dies
# after WAIT seconds naming WHAT.
wait_for() {
	local what=$1 deadline=$((SECONDS + WAIT))
	shift
	until "$@" >/dev/null 2>&1; do
		[ "$SECONDS" -lt "$deadline" ] || die "$what: not after ${WAIT}s (logs: $LOGS)"
		sleep 0.5
	done
}

# start_daemon DAEMON (e.g. osd.1): starts it in the foreground mode (-f)
# as our own background process, in its own session so that the caller's
# Ctrl-C or a killed test does not take it down, and records its PID and
# binary once the PID runs the daemon (setsid and `ip netns exec` exec it).
start_daemon() {
	local d=$1 bin pid i
	bin="/usr/bin/ceph-${d%%.*}"
	local -a ns=()
	[ -z "$CEPH_NETNS" ] || ns=(ip netns exec "$CEPH_NETNS")
	setsid "${ns[@]}" "$bin" -f -c "$CONF" -i "${d#*.}" </dev/null >>"$LOGS/$d.out" 2>&1 &
	pid=$!
	for ((i = 0; i < 100; i++)); do
		[ "$(readlink "/proc/$pid/exe" 2>/dev/null)" = "$bin" ] && break
		[ -d "/proc/$pid" ] || die "$d exited at start: $(tail -n 5 "$LOGS/$d.out")"
		sleep 0.1
	done
	[ "$(readlink "/proc/$pid/exe" 2>/dev/null)" = "$bin" ] || die "$d: pid $pid does not run $bin after 10s"
	printf '%s\n%s\n' "$pid" "$bin" >"$PIDS/$d.pid"
	log "started $d (pid $pid)"
}

# osds_up N: exactly N OSDs up and in, so the pool has its three copies.
osds_up() { admin osd stat | grep -qE "^$OSD_COUNT osds: $1 up.*, $OSD_COUNT in"; }
# pgs_clean: every placement group active+clean (needs the mgr's stats).
pgs_clean() { admin pg stat | grep -qE '^([0-9]+) pgs: \1 active\+clean;'; }
