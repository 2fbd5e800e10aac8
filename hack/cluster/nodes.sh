# The nodes of the e2e cluster (sourced by up.sh, down.sh and node.sh).
# Node I has its own network namespace (a veth on the hub's bridge), its
# own persistent mount namespace (per-node folders bound over the standard
# paths), its own cgroup subtree, containerd and kubelet.

# launch KEY LOG CGROUP NSENTER_ARGS... -- BINARY ARGS...: runs BINARY
# detached through nsenter, once (KEY names its pid file, see pid_of),
# first joining the freezer cgroup CGROUP ("" for none) so that everything
# it starts (containerd's shims) stays in it.
launch() {
	local key=$1 log=$2 cg=$3 pid pidfile="$PIDS/$1.pid"
	local -a nsargs=()
	shift 3
	while [ "$1" != -- ]; do nsargs+=("$1"); shift; done
	shift
	case $key in *@*) pidfile="$PIDS/${key%@*}-$(node_name "${key#*@}").pid" ;; esac
	if pid=$(pid_of "$key"); then
		log "$key already runs (pid $pid)"
		return 0
	fi
	log "starting $key (log $log)"
	[ -f "$log" ] && mv -f "$log" "$log.prev"
	(
		[ -z "$cg" ] || echo "$BASHPID" >"$cg/cgroup.procs"
		exec setsid nsenter "${nsargs[@]}" -- "$@"
	) </dev/null >"$log" 2>&1 &
	printf '%s\n%s\n' "$!" "$(readlink -f "$1")" >"$pidfile"
	# pid_of knows the daemon by its executable, which the launched pid has
	# only once nsenter has exec'd it: wait for that (or its early death)
	# so that a waiter never takes a slow exec for an exit.
	local n
	for ((n = 0; n < 100; n++)); do
		pid_of "$key" >/dev/null || ! [ -d "/proc/$!" ] && break
		sleep 0.1
	done
}

# wait_for WHAT SECONDS DAEMON CMD...: polls CMD, printing progress, failing
# early when DAEMON (a pid_of key) died.
wait_for() {
	local what=$1 limit=$2 daemon=$3 start=$SECONDS next=$((SECONDS + 5)) logf
	shift 3
	logf="$LOGS/$daemon.log"
	case $daemon in *@*) logf="$(node_dir "${daemon#*@}")/logs/${daemon%@*}.log" ;; esac
	until "$@" >/dev/null 2>&1; do
		if [ -n "$daemon" ] && ! pid_of "$daemon" >/dev/null; then
			tail -n 20 "$logf" >&2 || true
			die "$daemon exited while waiting for $what"
		fi
		((SECONDS - start < limit)) || { tail -n 20 "$logf" >&2 || true; die "timeout waiting for $what"; }
		if ((SECONDS >= next)); then
			log "  still waiting for $what ($((SECONDS - start))s)"
			next=$((SECONDS + 5))
		fi
		sleep 0.3
	done
	log "$what after $((SECONDS - start))s"
}

# node_freezer I: node I's cgroup in the freezer hierarchy. Its subtree
# holds every process of the node: daemons/ (containerd, its shims,
# kubelet) and kubelet's kubepods/.
node_freezer() { echo "/sys/fs/cgroup/freezer/$(node_cgroup "$1")"; }

# node_procs I: every pid in node I's cgroup subtree.
node_procs() {
	local c
	c=$(node_freezer "$1")
	[ -d "$c" ] && find "$c" -name cgroup.procs -exec cat {} + 2>/dev/null | sort -un
	return 0
}

# node_kill I: SIGKILL every process of node I (thawed first: a frozen
# process does not die), repeating while forks race the kill.
node_kill() {
	local i=$1 round pids
	node_thaw "$i"
	for ((round = 0; round < 50; round++)); do
		pids=$(node_procs "$i")
		[ -z "$pids" ] && return 0
		[ "$round" -eq 0 ] && log "killing the processes of $(node_name "$i"): $(echo $pids)"
		kill -KILL $pids 2>/dev/null || true
		sleep 0.1
	done
	log "warning: processes of $(node_name "$i") survive: $(node_procs "$i" | tr '\n' ' ')"
}

node_freeze() { echo FROZEN >"$(node_freezer "$1")/freezer.state"; }
node_thaw() {
	local f
	f="$(node_freezer "$1")/freezer.state"
	if [ -f "$f" ]; then echo THAWED >"$f"; fi
}

# setup_cgroups: $CGROUP_NAME/<node> in every v1 hierarchy (kubelet's
# cgroupRoot), and the freezer cgroup of each node's daemons.
setup_cgroups() {
	local c i d
	for c in /sys/fs/cgroup/*/; do
		c=${c%/}
		[ "$(basename "$c")" = unified ] && continue
		mountpoint -q "$c" || continue
		for i in $(node_indexes); do
			for d in "$c/$CGROUP_NAME" "$c/$(node_cgroup "$i")"; do
				mkdir -p "$d"
				# cpuset: a child is usable only once given cpus and mems.
				if [ -f "$c/cpuset.cpus" ] && [ -z "$(cat "$d/cpuset.cpus")" ]; then
					cat "$(dirname "$d")/cpuset.cpus" >"$d/cpuset.cpus"
					cat "$(dirname "$d")/cpuset.mems" >"$d/cpuset.mems"
				fi
			done
		done
	done
	for i in $(node_indexes); do mkdir -p "$(node_freezer "$i")/daemons"; done
}

# node_mountinfo I: the mount table of node I's mount namespace.
node_mountinfo() { nsenter --mount="$(node_mntns "$1")" -- cat /proc/self/mountinfo; }

# node_mounted I: true when node I's mount namespace is held by its file.
node_mounted() { grep -qF " $(node_mntns "$1") " /proc/self/mountinfo; }

# Host mounts a new node must not keep a copy of: they would pin other
# users' loop devices, FUSE servers and network namespaces until down.
# (Mount point prefixes, then fs types and sources, for awk.)
NODE_DROP_MOUNTS='^/(tmp|var/tmp|work|mnt|root|home|run/netns)(/|$)'

# setup_node_mntns I: node I's persistent mount namespace, made once. Its
# mounts are private: the host's later mounts do not enter and the node's
# stay inside. Each NODE_BINDS folder is a shared bind mount of the node's
# own folder (Bidirectional mounts of berth's pods need that).
setup_node_mntns() {
	local i=$1 f dir pair name path m
	f=$(node_mntns "$i") dir=$(node_dir "$i")
	mkdir -p "$MNTNS_DIR"
	# nsfs can only be bound onto a mount that is not shared.
	mountpoint -q "$MNTNS_DIR" || mount --bind "$MNTNS_DIR" "$MNTNS_DIR"
	mount --make-private "$MNTNS_DIR"
	if ! node_mounted "$i"; then
		log "mount namespace of $(node_name "$i"): $f"
		touch "$f"
		unshare --mount="$f" --propagation private true
		# Copies of host mounts that would pin others' devices, deepest first.
		node_mountinfo "$i" | awk -v drop="$NODE_DROP_MOUNTS" '{
				split($0, parts, " - "); split(parts[2], post, " ")
				if ($5 ~ drop || post[1] ~ /^fuse/ || post[1] == "nsfs" || post[2] ~ /^\/dev\/(loop|nbd)/) print $5
			}' | awk '{print length($0) " " $0}' | sort -rn | cut -d' ' -f2- |
			while read -r m; do
				m=$(printf '%b' "${m//\\/\\0}")
				nsenter --mount="$f" -- umount -l "$m" 2>/dev/null || true
			done
	fi
	for pair in "${NODE_BINDS[@]}"; do
		name=${pair%%=*} path=${pair#*=}
		mkdir -p "$dir/$name" "$path"
		if ! nsenter --mount="$f" -- mountpoint -q "$path"; then
			nsenter --mount="$f" -- mount --bind "$dir/$name" "$path"
		fi
		nsenter --mount="$f" -- mount --make-shared "$path"
	done
}

# setup_node_net I: node I's netns, its veth on the hub bridge, and routes:
# the hub (API server, Service CIDR) and the other nodes' pod CIDRs.
setup_node_net() {
	local i=$1 ns ip hubif j
	ns=$(node_netns "$i") ip=$(node_ip "$i") hubif=$(node_hub_if "$i")
	[ -e "/run/netns/$ns" ] || { log "netns $ns ($ip)"; ip netns add "$ns"; }
	ip -n "$ns" link set lo up
	ip -n "$NETNS" link show "$hubif" >/dev/null 2>&1 || ip -n "$NETNS" link add "$hubif" type veth peer name eth0 netns "$ns"
	ip -n "$NETNS" link set "$hubif" master "$HUB_BRIDGE" up
	ip -n "$ns" addr replace "$ip/24" dev eth0
	ip -n "$ns" link set eth0 up
	ip -n "$ns" route replace "$HUB_IP/32" via "$HUB_BRIDGE_IP"
	ip -n "$ns" route replace "$SERVICE_CIDR" via "$HUB_BRIDGE_IP"
	ip -n "$NETNS" route replace "$(node_pod_cidr "$i")" via "$ip"
	for j in $(node_indexes); do
		[ "$j" = "$i" ] || ip -n "$ns" route replace "$(node_pod_cidr "$j")" via "$(node_ip "$j")"
	done
}

# start_node I: containerd and kubelet of node I, in its namespaces and
# cgroup; IMPORT (a function name, optional) runs between the two.
start_node() {
	local i=$1 import=${2:-} dir name sock
	dir=$(node_dir "$i") name=$(node_name "$i") sock=$(node_sock "$i")
	local nsargs=(--net="/run/netns/$(node_netns "$i")" --mount="$(node_mntns "$i")")
	mkdir -p "$dir/logs"
	launch "containerd@$i" "$dir/logs/containerd.log" "$(node_freezer "$i")/daemons" "${nsargs[@]}" -- \
		"$(command -v containerd)" --config "$dir/config/containerd.toml"
	wait_for "containerd of $name ready" 60 "containerd@$i" ctr -a "$sock" version
	[ -z "$import" ] || "$import" "$i"
	launch "kubelet@$i" "$dir/logs/kubelet.log" "$(node_freezer "$i")/daemons" "${nsargs[@]}" -- \
		"$KUBE_BIN/kubelet" --config "$dir/config/kubelet.yaml" --kubeconfig "$dir/config/kubelet.kubeconfig" \
		--hostname-override "$name" --node-ip "$(node_ip "$i")" --v 1
}

# wait_node_ready I
wait_node_ready() {
	local name
	name=$(node_name "$1")
	wait_for "node $name Ready" 120 "kubelet@$1" \
		sh -c "'$KUBECTL' --kubeconfig '$KUBECONFIG_ADMIN' get node '$name' -o jsonpath='{.status.conditions[?(@.type==\"Ready\")].status}' | grep -qx True"
}

# stop_node_daemons I: kubelet, the containers, containerd (gently, for
# down.sh), then whatever is left in the node's cgroup.
stop_node_daemons() {
	local i=$1 pid id sock
	sock=$(node_sock "$i")
	node_thaw "$i"
	if pid=$(pid_of "kubelet@$i"); then log "stopping kubelet of $(node_name "$i") ($pid)"; stop_pid "$pid"; fi
	if pid_of "containerd@$i" >/dev/null; then
		for id in $(ctr -a "$sock" -n k8s.io tasks ls -q 2>/dev/null); do
			ctr -a "$sock" -n k8s.io tasks kill -s SIGKILL "$id" >/dev/null 2>&1 || true
			for ((n = 0; n < 50; n++)); do ctr -a "$sock" -n k8s.io tasks rm "$id" >/dev/null 2>&1 && break; sleep 0.1; done
		done
		for id in $(ctr -a "$sock" -n k8s.io containers ls -q 2>/dev/null); do
			ctr -a "$sock" -n k8s.io containers rm "$id" >/dev/null 2>&1 || true
		done
	fi
	# containerd lingers ~7s after "Stop CRI service"; its state is discarded.
	if pid=$(pid_of "containerd@$i"); then log "stopping containerd of $(node_name "$i") ($pid)"; stop_pid "$pid" 3; fi
	# Shims of a crash that left the cgroup: matched by the socket path.
	for pid in $(procs_matching "-address $sock" | cut -d' ' -f1); do log "stopping shim $pid"; stop_pid "$pid" 3; done
	node_kill "$i"
}

# teardown_node_mounts I: every mount of node I's namespace below its
# folders, deepest first, its loop devices, then the namespace itself.
teardown_node_mounts() {
	local i=$1 f round m dev back pair
	local -a roots=("$WORKDIR") mounts
	f=$(node_mntns "$i")
	node_mounted "$i" || return 0
	for pair in "${NODE_BINDS[@]}"; do roots+=("${pair#*=}"); done
	for round in 1 2 3; do
		mapfile -t mounts < <(MOUNTINFO=<(node_mountinfo "$i") mounts_under "${roots[@]}")
		[ ${#mounts[@]} -eq 0 ] && break
		for m in "${mounts[@]}"; do
			if [ "$round" -lt 3 ]; then
				nsenter --mount="$f" -- umount "$m" 2>/dev/null || true
			else
				log "busy mount $m in $(node_name "$i"): lazy unmount"
				nsenter --mount="$f" -- umount -l "$m" || true
			fi
		done
	done
	# Backing files as the node sees them (the same path on every node).
	while read -r dev back; do
		for m in "${roots[@]}"; do
			case "$back" in "$m"/*) log "detaching $dev ($back) of $(node_name "$i")"; losetup -d "$dev" || true; break ;; esac
		done
	done < <(nsenter --mount="$f" -- losetup -nl -O NAME,BACK-FILE 2>/dev/null)
	log "releasing the mount namespace of $(node_name "$i")"
	umount "$f" || umount -l "$f" || true
	rm -f "$f"
}
