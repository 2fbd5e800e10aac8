#!/usr/bin/env bash
# Brings up the test Ceph (hack/ceph/README.md): 1 mon, 1 mgr, 3 bluestore
# OSDs on files, a replicated pool (size 3, min_size 2, application rbd),
# cephx on with client.$CLIENT (operator: `profile rbd` on that pool plus
# the blocklist command) and client.$NODE_CLIENT (nodes: `profile rbd`). Waits
# until every placement group is active+clean, then writes $ENV_FILE and
# prints its path. Idempotent: on a running cluster it only starts daemons
# that are not running (an OSD killed by osd.sh) and waits for health again.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=lib.sh
. "$HERE/lib.sh"

[ "$(id -u)" -eq 0 ] || die "needs root (daemons, $CEPH_DIR)"
start=$SECONDS
"$HERE/../install-deps.sh" ceph-mon ceph-osd ceph-mgr ceph-common

# networks: the public_network/cluster_network lines, when both are set.
networks() {
	[ -n "$CEPH_PUBLIC_NETWORK" ] && [ -n "$CEPH_CLUSTER_NETWORK" ] || return 0
	printf 'public_network = %s\ncluster_network = %s\n' "$CEPH_PUBLIC_NETWORK" "$CEPH_CLUSTER_NETWORK"
}

write_conf() {
	local fsid=$1
	# Daemon settings name their own paths through Ceph's $type/$id/$name so
	# that nothing lands in /var/lib/ceph, /var/log/ceph or /var/run/ceph.
	cat >"$CONF" <<EOC
[global]
fsid = $fsid
mon_host = [v2:$CEPH_ADDR:$MON_PORT]
public_addr = $CEPH_ADDR
cluster_addr = $CEPH_CLUSTER_ADDR
$(networks)ms_bind_msgr1 = false
ms_bind_port_min = $PORT_MIN
ms_bind_port_max = $PORT_MAX
auth_cluster_required = cephx
auth_service_required = cephx
auth_client_required = cephx
auth_allow_insecure_global_id_reclaim = false
run_dir = $CEPH_DIR/run
crash_dir = $CEPH_DIR/crash
osd_pool_default_size = 3
osd_pool_default_min_size = 2
osd_pool_default_pg_autoscale_mode = off
# All OSDs are on one host: copies go to distinct OSDs.
osd_crush_chooseleaf_type = 0
mon_allow_pool_delete = true
# The host's disk is shared and often well filled: only warn when nearly full.
mon_data_avail_warn = 5
mon_data_avail_crit = 2
# A killed OSD is noticed in seconds (tests kill one on purpose).
osd_heartbeat_interval = 2
osd_heartbeat_grace = 10
# Recovery after an OSD comes back runs at full speed (no throttling sleep).
osd_recovery_sleep = 0
# Placement group states reach the monitor within a second, so that waits
# for active+clean end as soon as they can.
mgr_stats_period = 1
osd_mon_report_interval = 1

[client.admin]
keyring = $ADMIN_KEYRING

[mon]
mon_data = $CEPH_DIR/\$type/\$id
# The cluster and audit logs too (default: /var/log/ceph).
mon_cluster_log_file = default=$LOGS/\$cluster.\$channel.log cluster=$LOGS/\$cluster.log
keyring = $CEPH_DIR/\$type/\$id/keyring
log_file = $LOGS/\$name.log
admin_socket = $CEPH_DIR/run/\$cluster-\$name.\$pid.asok
[mgr]
mgr_data = $CEPH_DIR/\$type/\$id
keyring = $CEPH_DIR/\$type/\$id/keyring
log_file = $LOGS/\$name.log
admin_socket = $CEPH_DIR/run/\$cluster-\$name.\$pid.asok
[osd]
osd_data = $CEPH_DIR/\$type/\$id
keyring = $CEPH_DIR/\$type/\$id/keyring
log_file = $LOGS/\$name.log
admin_socket = $CEPH_DIR/run/\$cluster-\$name.\$pid.asok
osd_objectstore = bluestore
bluestore_block_path = $CEPH_DIR/osd-block/\$id
bluestore_block_create = true
bluestore_block_size = $OSD_BLOCK_SIZE
bluestore_block_db_create = false
bluestore_block_wal_create = false
# Small caches: three OSDs share a small test machine.
osd_memory_target = 939524096
bluestore_cache_autotune = false
bluestore_cache_size = 67108864
EOC
	# What clients (tests, later berth) read: monitors, auth and the path of
	# the berth client's keyring, nothing of the daemons.
	cat >"$CLIENT_CONF" <<EOC
[global]
fsid = $fsid
mon_host = [v2:$CEPH_ADDR:$MON_PORT]
auth_cluster_required = cephx
auth_service_required = cephx
auth_client_required = cephx

[client.$CLIENT]
keyring = $CLIENT_KEYRING
EOC
}

# new_key FILE NAME CAPS...: a fresh keyring (0600) holding one key.
new_key() {
	local file=$1 name=$2
	shift 2
	(umask 077 && ceph-authtool --create-keyring "$file" --gen-key -n "$name" "$@" >/dev/null)
}

bootstrap() {
	local fsid i d
	fsid=$(cat /proc/sys/kernel/random/uuid)
	mkdir -p "$CEPH_DIR"
	chmod 700 "$CEPH_DIR"
	mkdir -p "$PIDS" "$LOGS" "$CEPH_DIR"/{run,crash,keyring,client,mon/a,mgr/x,osd-block}
	write_conf "$fsid"

	# Every key exists before the monitor does: its first keyring holds them
	# all, so the mon starts with the daemons' and clients' auth entries.
	local monkeys="$CEPH_DIR/keyring/mon.keyring"
	new_key "$monkeys" mon. --cap mon 'allow *'
	new_key "$ADMIN_KEYRING" client.admin --cap mon 'allow *' --cap osd 'allow *' --cap mgr 'allow *' --cap mds 'allow *'
	# Keys by role. The operator's and CSI controller's client (the
	# StorageCluster's secretRef) may also take a client off the blocklist
	# (the Unfencer, once a fenced node is back and cleaned). The nodes'
	# client (nodeSecretRef, the node-stage secret every node holds) has
	# `profile rbd` alone, which may put a client on the blocklist (lock
	# breaking) but never take one off.
	new_key "$CLIENT_KEYRING" "client.$CLIENT" --cap mon 'profile rbd, allow command "osd blocklist"' \
		--cap osd "profile rbd pool=$POOL" --cap mgr "profile rbd pool=$POOL"
	new_key "$NODE_KEYRING" "client.$NODE_CLIENT" --cap mon 'profile rbd' \
		--cap osd "profile rbd pool=$POOL" --cap mgr "profile rbd pool=$POOL"
	new_key "$CEPH_DIR/mgr/x/keyring" mgr.x --cap mon 'allow profile mgr' --cap osd 'allow *' --cap mds 'allow *'
	for ((i = 0; i < OSD_COUNT; i++)); do
		mkdir -p "$CEPH_DIR/osd/$i"
		new_key "$CEPH_DIR/osd/$i/keyring" "osd.$i" --cap mon 'allow profile osd' --cap mgr 'allow profile osd' --cap osd 'allow *'
	done
	for f in "$ADMIN_KEYRING" "$CLIENT_KEYRING" "$NODE_KEYRING" "$CEPH_DIR/mgr/x/keyring" "$CEPH_DIR"/osd/*/keyring; do
		ceph-authtool "$monkeys" --import-keyring "$f" >/dev/null
	done

	monmaptool --create --fsid "$fsid" --addv a "[v2:$CEPH_ADDR:$MON_PORT]" "$CEPH_DIR/monmap" >/dev/null
	timeout "$WAIT" ceph-mon --mkfs -c "$CONF" -i a --monmap "$CEPH_DIR/monmap" --keyring "$monkeys" >>"$LOGS/mon.a.out" 2>&1 ||
		die "ceph-mon --mkfs failed: $(tail -n 5 "$LOGS/mon.a.out")"
	rm -f "$monkeys" "$CEPH_DIR/monmap"
	start_daemon mon.a
	wait_for "monitor answering on $CEPH_ADDR:$MON_PORT" admin mon stat

	# OSD ids are handed out in order: register 0, 1, 2, then make their
	# stores side by side (bluestore's mkfs takes a few seconds each).
	local -a mkfs=()
	for ((i = 0; i < OSD_COUNT; i++)); do
		local uuid
		uuid=$(cat /proc/sys/kernel/random/uuid)
		[ "$(admin osd new "$uuid" "$i")" = "$i" ] || die "ceph osd new $uuid $i did not return $i"
		# mkfs asks the monitor for its map: in CEPH_NETNS too.
		in_ns timeout "$WAIT" ceph-osd --mkfs -c "$CONF" -i "$i" --osd-uuid "$uuid" >>"$LOGS/osd.$i.out" 2>&1 &
		mkfs+=($!)
	done
	for ((i = 0; i < OSD_COUNT; i++)); do
		wait "${mkfs[$i]}" && continue
		# Leave no mkfs of ours running behind the error.
		kill "${mkfs[@]}" 2>/dev/null || true
		wait || true
		die "ceph-osd --mkfs -i $i failed: $(tail -n 5 "$LOGS/osd.$i.out")"
	done
	for d in "${DAEMONS[@]:1}"; do start_daemon "$d"; done
	wait_for "$OSD_COUNT OSDs up and in" osds_up "$OSD_COUNT"

	admin osd pool create "$POOL" "$PG_NUM" "$PG_NUM" replicated >/dev/null
	admin osd pool set "$POOL" size 3 >/dev/null
	admin osd pool set "$POOL" min_size 2 >/dev/null
	admin osd pool application enable "$POOL" rbd >/dev/null
	in_ns timeout 60 rbd -c "$CONF" -n client.admin pool init "$POOL"
	touch "$READY"
}

write_env() {
	local tmp="$ENV_FILE.tmp"
	# No key in here: only the path of the 0600 keyring.
	cat >"$tmp" <<EOE
BERTH_CEPH_DIR=$CEPH_DIR
BERTH_CEPH_NETNS=$CEPH_NETNS
BERTH_CEPH_FSID=$(sed -n 's/^fsid = //p' "$CLIENT_CONF")
BERTH_CEPH_MON_HOST=[v2:$CEPH_ADDR:$MON_PORT]
BERTH_CEPH_MONITORS=$CEPH_ADDR:$MON_PORT
BERTH_CEPH_POOL=$POOL
BERTH_CEPH_CLIENT=$CLIENT
BERTH_CEPH_KEYRING=$CLIENT_KEYRING
BERTH_CEPH_NODE_CLIENT=$NODE_CLIENT
BERTH_CEPH_NODE_KEYRING=$NODE_KEYRING
BERTH_CEPH_CONF=$CLIENT_CONF
BERTH_CEPH_ADMIN_KEYRING=$ADMIN_KEYRING
BERTH_CEPH_ADMIN_CONF=$CONF
EOE
	mv "$tmp" "$ENV_FILE"
}

if [ -f "$READY" ]; then
	n=0
	for d in "${DAEMONS[@]}"; do
		pid_of "$d" >/dev/null || { start_daemon "$d" && n=$((n + 1)); }
	done
	log "already bootstrapped; $n daemon(s) started"
else
	if [ -e "$CEPH_DIR" ]; then
		log "$CEPH_DIR is half made: removing it first"
		"$HERE/down.sh"
	fi
	bootstrap
fi
wait_for "monitor answering on $CEPH_ADDR:$MON_PORT" admin mon stat
wait_for "$OSD_COUNT OSDs up and in" osds_up "$OSD_COUNT"
wait_for "every placement group active+clean" pgs_clean
write_env
log "up in $((SECONDS - start))s: $(admin -s -f plain 2>/dev/null | sed -n 's/^ *health: //p')"
echo "$ENV_FILE"
