# Shared settings of hack/cluster/up.sh and down.sh (sourced, not run).
# Every name, address and folder the e2e cluster uses is here, overridable
# through the environment, so up and down always agree on what they own.

# shellcheck source=../lib/procs.sh
. "$(dirname "${BASH_SOURCE[0]}")/../lib/procs.sh"

WORKDIR="${BERTH_E2E_DIR:-/var/lib/berth-e2e}"
# The hub: a network namespace holding the control plane (etcd, API server,
# controller-manager, scheduler) and the bridge that joins the nodes.
NETNS="${BERTH_E2E_NETNS:-berth-e2e}"
# veth pair: HOST_IF stays in the host namespace (so kubectl and go test on
# the host reach the API server), NS_IF carries HUB_IP inside the hub.
HOST_IF="${BERTH_E2E_HOST_IF:-berth-e2e-h}"
NS_IF="${BERTH_E2E_NS_IF:-berth0}"
HOST_IP="${BERTH_E2E_HOST_IP:-10.250.0.1}"
# The API server's address (the single-node cluster's node IP, kept).
HUB_IP="${BERTH_E2E_HUB_IP:-${BERTH_E2E_NODE_IP:-10.250.0.2}}"
# Node network: bridge HUB_BRIDGE in the hub (HUB_BRIDGE_IP) with one veth
# per node; node i is NODE_NET_PREFIX.(10+i), its pods POD_NET_PREFIX.i.0/24.
HUB_BRIDGE="${BERTH_E2E_HUB_BRIDGE:-berth-nodes}"
NODE_NET_PREFIX="${BERTH_E2E_NODE_NET_PREFIX:-10.250.1}"
HUB_BRIDGE_IP="$NODE_NET_PREFIX.1"
POD_NET_PREFIX="${BERTH_E2E_POD_NET_PREFIX:-10.251}"
POD_NET="$POD_NET_PREFIX.0.0/16"
SERVICE_CIDR="${BERTH_E2E_SERVICE_CIDR:-10.252.0.0/24}"
SERVICE_IP="${BERTH_E2E_SERVICE_IP:-10.252.0.1}"
# The pod bridge inside each node's netns.
BRIDGE="${BERTH_E2E_BRIDGE:-berth-br0}"
# 443 and SERVICE_IP on the hub's lo: the "kubernetes" Service address
# reaches the API server without kube-proxy, for pods and hostNetwork pods
# of every node alike (their routes to SERVICE_CIDR lead to the hub), so
# in-cluster client config works unchanged.
API_PORT="${BERTH_E2E_API_PORT:-443}"
# Node count: `make e2e` asks for 2, `berth dev up` for --nodes (default 1).
NODE_COUNT="${BERTH_E2E_NODES:-1}"
NODE_PREFIX="${BERTH_E2E_NODE_PREFIX:-berth-e2e-node}"
# Standard kubelet root and volume plugin dir inside every node's mount
# namespace (the Kubernetes storage suite hard-codes /var/lib/kubelet).
KUBELET_ROOT=/var/lib/kubelet
VOLUME_PLUGIN_DIR="$WORKDIR/volume-plugins"
# berth's data folder (the StorageCluster's dataDir) and the run folder of
# its agent and keeper: the same path on every node, each node's own
# content (a per-node folder bound over it in the node's mount namespace).
BERTH_DATA_DIR="$WORKDIR/berth-data"
BERTH_RUN_DIR=/run/berth
# The multus holders' records (network.DefaultDir and the netns-mode
# folders below it), per node like the rest.
BERTH_NETWORK_DIR=/var/lib/berth/network
# Where each node's mount namespace shows its own folder
# ($WORKDIR/nodes/<node>/<name>): "name=path" pairs. Shared mounts inside
# the node: kubelet's root and berth's folders take Bidirectional mounts.
NODE_BINDS=(kubelet="$KUBELET_ROOT" containerd-run=/run/containerd cni=/var/lib/cni
	log-containers=/var/log/containers run-berth="$BERTH_RUN_DIR" berth-data="$BERTH_DATA_DIR"
	volume-plugins="$VOLUME_PLUGIN_DIR" berth-network="$BERTH_NETWORK_DIR")
# The test Ceph (hack/cluster/ceph.sh: hack/ceph's daemons) in its own
# netns on the node bridge, reached from the nodes and their pods over the
# cluster network as a real one would be.
E2E_CEPH_NETNS="${BERTH_E2E_CEPH_NETNS:-$NETNS-ceph}"
E2E_CEPH_IP="${BERTH_E2E_CEPH_IP:-$NODE_NET_PREFIX.5}"
# Its end of the hub bridge, in the hub.
E2E_CEPH_HUB_IF="${BERTH_E2E_CEPH_HUB_IF:-berth-ceph}"
E2E_CEPH_DIR="$WORKDIR/ceph"
# Multus (multus.sh, opt-in: BERTH_E2E_MULTUS=1): the storage networks,
# each a bridge in the hub with a veth to every node (its node end the
# macvlan master there), addresses from whereabouts; the CNI bin folder
# that holds multus, whereabouts and Debian's plugins; the mark that keeps
# multus on for later ups until down.
PUBLIC_BRIDGE="${BERTH_E2E_PUBLIC_BRIDGE:-berth-pub}"
CLUSTER_BRIDGE="${BERTH_E2E_CLUSTER_BRIDGE:-berth-clu}"
PUBLIC_NET_PREFIX="${BERTH_E2E_PUBLIC_NET_PREFIX:-10.253.0}"
CLUSTER_NET_PREFIX="${BERTH_E2E_CLUSTER_NET_PREFIX:-10.254.0}"
NODE_PUBLIC_IF=pub0
NODE_CLUSTER_IF=clu0
NAD_NAMESPACE=default
CNI_BIN_DIR="$WORKDIR/cni-bin"
MULTUS_MARK="$WORKDIR/multus"
# With multus, the test Ceph sits on the storage networks only, not on the
# node bridge: its public address (monitor, OSDs' client side) on
# $PUBLIC_BRIDGE, its OSDs' replication address on $CLUSTER_BRIDGE, both
# below .10, where the definitions' whereabouts ranges start (no pod gets
# them). Nodes and pods reach it only through a storage interface.
E2E_CEPH_PUBLIC_IP="${BERTH_E2E_CEPH_PUBLIC_IP:-$PUBLIC_NET_PREFIX.5}"
E2E_CEPH_CLUSTER_IP="${BERTH_E2E_CEPH_CLUSTER_IP:-$CLUSTER_NET_PREFIX.5}"
# Its ends of the two bridges, in the hub.
E2E_CEPH_PUBLIC_HUB_IF="${BERTH_E2E_CEPH_PUBLIC_HUB_IF:-berth-ceph-pub}"
E2E_CEPH_CLUSTER_HUB_IF="${BERTH_E2E_CEPH_CLUSTER_HUB_IF:-berth-ceph-clu}"
# Persistent mount namespaces (nsfs files) live here, on a private mount.
MNTNS_DIR="$WORKDIR/mntns"
NODES_DIR="$WORKDIR/nodes"
NODES_LIST="$WORKDIR/nodes.list"
# All pod cgroups live below this cgroup (one child per node) so that
# down.sh finds them.
CGROUP_NAME="${BERTH_E2E_CGROUP:-berth-e2e}"

PKI="$WORKDIR/pki"
CONF="$WORKDIR/config"
LOGS="$WORKDIR/logs"
PIDS="$WORKDIR/pids"
IMAGES="$WORKDIR/images"
SYSCTL_SAVED="$WORKDIR/sysctl.saved"
HOST_CREATED="$WORKDIR/host-created"
KUBECONFIG_ADMIN="$WORKDIR/admin.kubeconfig"
API_SERVER="https://$HUB_IP:$API_PORT"

# The global (not per-namespace) sysctls kubelet sets at start.
KUBELET_SYSCTLS=(vm.overcommit_memory vm.panic_on_oom kernel.panic kernel.panic_on_oops kernel.keys.root_maxkeys kernel.keys.root_maxbytes)
# Host paths the nodes' bind mounts need as mount points (and `ip netns
# add` makes /run/netns): down.sh removes those that did not exist before.
HOST_PATHS=(/var/log/containers /var/lib/cni /run/containerd /var/lib/kubelet /run/netns "$BERTH_RUN_DIR"
	"$(dirname "$BERTH_NETWORK_DIR")" "$BERTH_NETWORK_DIR")
# Control-plane daemons in start order; node daemons are containerd, kubelet.
DAEMONS=(etcd kube-apiserver kube-controller-manager kube-scheduler)
NODE_DAEMONS=(containerd kubelet)

# --- per-node names (node index i = 1..N) ------------------------------------
node_name() { echo "$NODE_PREFIX-$1"; }
node_ip() { echo "$NODE_NET_PREFIX.$((10 + $1))"; }
node_pod_cidr() { echo "$POD_NET_PREFIX.$1.0/24"; }
node_netns() { echo "$NETNS-n$1"; }
# The node's end of the hub bridge, in the hub.
node_hub_if() { echo "berth-n$1"; }
# Node I's ends of the storage networks' bridges, in the hub.
node_public_hub_if() { echo "berth-pub-n$1"; }
node_cluster_hub_if() { echo "berth-clu-n$1"; }
node_dir() { echo "$NODES_DIR/$(node_name "$1")"; }
node_mntns() { echo "$MNTNS_DIR/$(node_name "$1")"; }
node_sock() { echo "$(node_dir "$1")/containerd/containerd.sock"; }
node_cgroup() { echo "$CGROUP_NAME/$(node_name "$1")"; }
# node_index NAME: the index of node NAME (its name or its index accepted).
node_index() {
	local i
	for i in $(node_indexes); do
		if [ "$1" = "$i" ] || [ "$1" = "$(node_name "$i")" ]; then
			echo "$i"
			return 0
		fi
	done
	return 1
}
# node_indexes: the nodes up.sh made (nodes.list), else 1..NODE_COUNT.
node_indexes() {
	if [ -s "$NODES_LIST" ]; then cat "$NODES_LIST"; else seq 1 "$NODE_COUNT"; fi
}
# in_node I CMD...: CMD in node I's network and mount namespaces.
in_node() {
	local i=$1
	shift
	nsenter --net="/run/netns/$(node_netns "$i")" --mount="$(node_mntns "$i")" -- "$@"
}

export PATH="/usr/local/go/bin:/usr/local/sbin:/usr/sbin:/sbin:$PATH"

log() { printf '[cluster %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "error: $*"; exit 1; }

# ticking WHAT CMD...: runs CMD, logging "still WHAT" every 15 s so that a
# long build is never a long silence. CMD's stdout passes through.
ticking() {
	local what=$1 ticker rc=0 start=$SECONDS
	shift
	# The ticker waits on its sleep with `wait`, which a TERM interrupts:
	# a trap waits for a foreground sleep to end, and cost every call up to
	# 15 s (~2 minutes of each cluster bring-up).
	(
		s=
		trap 'kill "$s" 2>/dev/null; exit 0' TERM
		while :; do
			sleep 15 &
			s=$!
			wait "$s" || exit 0
			log "  still $what ($((SECONDS - start))s)"
		done
	) >&2 &
	ticker=$!
	"$@" || rc=$?
	kill "$ticker" 2>/dev/null || true
	wait "$ticker" 2>/dev/null || true
	return "$rc"
}

# pid_of NAME prints the recorded PID of daemon NAME if that process still
# runs the recorded binary ("NAME@I": daemon NAME of node I).
pid_of() {
	local f="$PIDS/$1.pid"
	case $1 in *@*) f="$PIDS/${1%@*}-$(node_name "${1#*@}").pid" ;; esac
	pidfile_pid "$f"
}

# module_dir MODULE@VERSION: its folder in the module cache (downloaded once).
module_dir() {
	local tmp dir
	tmp=$(mktemp -d)
	dir=$(cd "$tmp" && timeout 300 env GOFLAGS=-mod=mod go mod download -json "$1" | sed -n 's/.*"Dir": "\(.*\)".*/\1/p') || true
	rm -rf "$tmp"
	[ -n "$dir" ] && [ -d "$dir" ] || die "could not download $1 from the Go module proxy"
	echo "$dir"
}

kctl() { "$KUBECTL" --kubeconfig "$KUBECONFIG_ADMIN" "$@"; }

# mounts_under DIR...: mount points at or below any DIR, deepest first, of
# this mount namespace (or of the one MOUNTINFO names).
mounts_under() {
	local d
	awk '{print $5}' "${MOUNTINFO:-/proc/self/mountinfo}" | while read -r m; do
		m=$(printf '%b' "${m//\\/\\0}")
		for d in "$@"; do
			case "$m" in "$d" | "$d"/*) echo "$m" ;; esac
		done
	done | awk '{print length($0) " " $0}' | sort -rn -k1,1 | cut -d' ' -f2- | uniq
}
