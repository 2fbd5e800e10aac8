# Shared settings of hack/cluster/up.sh and down.sh (sourced, not run).
# Every name, address and folder the e2e cluster uses is here, overridable
# through the environment, so up and down always agree on what they own.

WORKDIR="${BERTH_E2E_DIR:-/var/lib/berth-e2e}"
NETNS="${BERTH_E2E_NETNS:-berth-e2e}"
# veth pair: HOST_IF stays in the host namespace (so kubectl and go test on
# the host reach the API server), NS_IF carries the node IP inside NETNS.
HOST_IF="${BERTH_E2E_HOST_IF:-berth-e2e-h}"
NS_IF="${BERTH_E2E_NS_IF:-berth0}"
HOST_IP="${BERTH_E2E_HOST_IP:-10.250.0.1}"
NODE_IP="${BERTH_E2E_NODE_IP:-10.250.0.2}"
POD_CIDR="${BERTH_E2E_POD_CIDR:-10.251.0.0/24}"
SERVICE_CIDR="${BERTH_E2E_SERVICE_CIDR:-10.252.0.0/24}"
SERVICE_IP="${BERTH_E2E_SERVICE_IP:-10.252.0.1}"
BRIDGE="${BERTH_E2E_BRIDGE:-berth-br0}"
# 443 and SERVICE_IP on the netns's lo: the "kubernetes" Service address
# reaches the API server without kube-proxy, for pods and hostNetwork pods
# alike, so in-cluster client config works unchanged.
API_PORT="${BERTH_E2E_API_PORT:-443}"
NODE_NAME="${BERTH_E2E_NODE_NAME:-berth-e2e-node}"
# CSI and Flexvolume paths depend on these two: the Helm chart must be told.
KUBELET_ROOT="${BERTH_E2E_KUBELET_ROOT:-$WORKDIR/kubelet}"
VOLUME_PLUGIN_DIR="${BERTH_E2E_VOLUME_PLUGIN_DIR:-$WORKDIR/volume-plugins}"
# berth's data folder (the StorageCluster's dataDir) and the run folder the
# operator gives its agent and keeper (fixed: /run/berth). Both are mounted
# Bidirectional into berth's pods, which needs them on a shared mount: a
# systemd host's / is rshared, this machine's is private, so up.sh makes
# each a shared bind mount of itself and down.sh unmounts it.
BERTH_DATA_DIR="$WORKDIR/berth-data"
BERTH_RUN_DIR=/run/berth
SHARED_DIRS=("$BERTH_DATA_DIR" "$BERTH_RUN_DIR")
# All pod cgroups live below this cgroup so that down.sh finds them.
CGROUP_NAME="${BERTH_E2E_CGROUP:-berth-e2e}"

CONTAINERD_DIR="$WORKDIR/containerd"
CONTAINERD_SOCK="$CONTAINERD_DIR/containerd.sock"
PKI="$WORKDIR/pki"
CONF="$WORKDIR/config"
LOGS="$WORKDIR/logs"
PIDS="$WORKDIR/pids"
IMAGES="$WORKDIR/images"
POD_LOGS="$WORKDIR/pod-logs"
CNI_DIR="$WORKDIR/cni"
SYSCTL_SAVED="$WORKDIR/sysctl.saved"
HOST_CREATED="$WORKDIR/host-created"
KUBECONFIG_ADMIN="$WORKDIR/admin.kubeconfig"
API_SERVER="https://$NODE_IP:$API_PORT"

# The global (not per-namespace) sysctls kubelet sets at start.
KUBELET_SYSCTLS=(vm.overcommit_memory vm.panic_on_oom kernel.panic kernel.panic_on_oops kernel.keys.root_maxkeys kernel.keys.root_maxbytes)
# Host paths that kubelet, containerd or `ip netns` create outside the work
# dir whatever their config says (kubelet's device-plugin socket is always
# under /var/lib/kubelet; `ip netns add` bind-mounts /run/netns on itself).
HOST_PATHS=(/var/log/containers /var/lib/cni /run/containerd /var/lib/kubelet /run/netns "$BERTH_RUN_DIR")
# Daemons in start order; down stops them in reverse.
DAEMONS=(etcd kube-apiserver kube-controller-manager kube-scheduler containerd kubelet)

export PATH="/usr/local/go/bin:/usr/local/sbin:/usr/sbin:/sbin:$PATH"

log() { printf '[cluster %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "error: $*"; exit 1; }

# ticking WHAT CMD...: runs CMD, logging "still WHAT" every 15 s so that a
# long build is never a long silence. CMD's stdout passes through.
ticking() {
	local what=$1 ticker rc=0 start=$SECONDS
	shift
	(
		trap 'exit 0' TERM
		while sleep 15; do log "  still $what ($((SECONDS - start))s)"; done
	) >&2 &
	ticker=$!
	"$@" || rc=$?
	kill "$ticker" 2>/dev/null || true
	wait "$ticker" 2>/dev/null || true
	return "$rc"
}

# pid_of NAME prints the recorded PID of daemon NAME if that process still
# runs the recorded binary (a recycled PID is not ours).
pid_of() {
	local f="$PIDS/$1.pid" pid exe
	[ -f "$f" ] || return 1
	{ read -r pid && read -r exe; } <"$f" || return 1
	[ -n "$pid" ] && [ "$(readlink "/proc/$pid/exe" 2>/dev/null)" = "$exe" ] || return 1
	echo "$pid"
}

# stop_pid PID [SECONDS]: SIGTERM, wait, then SIGKILL.
stop_pid() {
	local pid=$1 wait=${2:-10} i
	kill -TERM "$pid" 2>/dev/null || return 0
	for ((i = 0; i < wait * 10; i++)); do
		[ -d "/proc/$pid" ] || return 0
		# A zombie child of ours counts as gone.
		grep -q '^State:.*Z' "/proc/$pid/status" 2>/dev/null && return 0
		sleep 0.1
	done
	log "pid $pid ignored SIGTERM for ${wait}s: SIGKILL"
	kill -KILL "$pid" 2>/dev/null || true
}

# procs_matching STR...: "PID CMDLINE" of every process whose command line
# (arguments joined by spaces) contains any STR. Bash builtins only, so the
# search does not find itself.
procs_matching() {
	local f pid cmd s
	local -a args
	for f in /proc/[0-9]*/cmdline; do
		pid=${f#/proc/}
		pid=${pid%/cmdline}
		[ "$pid" = "$$" ] || [ "$pid" = "$BASHPID" ] && continue
		mapfile -d '' -t args 2>/dev/null <"$f" || continue
		cmd="${args[*]}"
		for s in "$@"; do
			case "$cmd" in *"$s"*) echo "$pid ${cmd:0:150}"; break ;; esac
		done
	done
}

kctl() { "$KUBECTL" --kubeconfig "$KUBECONFIG_ADMIN" "$@"; }

# mounts_under DIR...: mount points at or below any DIR, deepest first.
mounts_under() {
	local d
	awk '{print $5}' /proc/self/mountinfo | while read -r m; do
		m=$(printf '%b' "${m//\\/\\0}")
		for d in "$@"; do
			case "$m" in "$d" | "$d"/*) echo "$m" ;; esac
		done
	done | awk '{print length($0) " " $0}' | sort -rn -k1,1 | cut -d' ' -f2- | uniq
}
