#!/usr/bin/env bash
# Brings up an N-node Kubernetes for berth's end-to-end tests on this
# machine: the control plane once, in the hub network namespace $NETNS
# (the host reaches the API server over a private veth pair only), and
# per node its own network and mount namespaces, cgroup, containerd and
# kubelet, joined by a bridge in the hub. No test traffic leaves.
#
#   BERTH_E2E_NODES=2 hack/cluster/up.sh   idempotent: a second run finds what runs
#
# Writes $WORKDIR/cluster.env (KUBECONFIG, NODES, NODE_NAME_<i>, KUBELET_ROOT,
# API_SERVER, ...). Stop with hack/cluster/down.sh; hack/cluster/node.sh
# stops, freezes or cuts off one node.
# Set BERTH_E2E_BERTH_BINARY to a berth binary (make build) to also build and
# import the berth image (tag berth.local/berth:dev); BERTH_E2E_MULTUS=1 to
# give the cluster multus, whereabouts and two storage networks (multus.sh).
# BERTH_E2E_VM_NODES=M adds M VM nodes after the netns nodes: qemu guests
# with Debian 13's kernel on the hub bridge (hack/vm).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
# shellcheck source=lib.sh
. "$HERE/lib.sh"
. "$HERE/pki.sh"
. "$HERE/configs.sh"
. "$HERE/images.sh"
. "$HERE/nodes.sh"
. "$HERE/dns.sh"
. "$HERE/multus.sh"
# shellcheck source=../vm/vm.sh
. "$REPO/hack/vm/vm.sh"

[ "$(id -u)" -eq 0 ] || die "run as root (netns, mounts, cgroups)"
t0=$SECONDS

log "packages: containerd runc containernetworking-plugins busybox-static openssl"
"$REPO/hack/install-deps.sh" containerd runc containernetworking-plugins busybox-static openssl iproute2 util-linux

log "kube binaries (cached by version; a cold build takes minutes)"
KUBE_BIN=$(ticking "building kube binaries" "$REPO/hack/kube-binaries.sh" \
	etcd kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy kubectl | tail -n1)
KUBECTL="$KUBE_BIN/kubectl"

mkdir -p "$WORKDIR" "$PKI" "$CONF" "$LOGS" "$PIDS" "$IMAGES" "$NODES_DIR" "$WORKDIR/bin"

echo "$KUBE_BIN" >"$WORKDIR/kube-bin"
# The node count is fixed by the first up: a second up finds the same nodes.
# VM nodes come after the netns nodes (vm-nodes.list names them).
total=$((NODE_COUNT + VM_NODE_COUNT))
# A cluster of another shape (say, a VM node where a netns node was
# asked) is refused: its scenarios would fail for reasons of its own.
if [ -s "$NODES_LIST" ] && [ -n "${BERTH_E2E_NODES:-}${BERTH_E2E_VM_NODES:-}" ]; then
	have_vm=$(vm_indexes | grep -c . || true)
	have_netns=$(($(wc -l <"$NODES_LIST") - have_vm))
	if [ "$have_netns" != "$NODE_COUNT" ] || [ "$have_vm" != "$VM_NODE_COUNT" ]; then
		die "the cluster up has $have_netns netns and $have_vm VM nodes, asked $NODE_COUNT and $VM_NODE_COUNT: run \`berth dev down\` (or down.sh) first"
	fi
fi
if [ ! -s "$NODES_LIST" ]; then
	seq "$((NODE_COUNT + 1))" "$total" >"$VM_NODES_LIST"
	seq 1 "$total" >"$NODES_LIST"
fi
if [ -n "$(vm_indexes)" ]; then
	# The guest has no multus binaries (its CNI is the bridge of configs.sh).
	multus_enabled && die "VM nodes (BERTH_E2E_VM_NODES) do not support multus yet"
	log "VM nodes: $(vm_indexes | tr '\n' ' ')(qemu, image of hack/vm/image.sh)"
	"$REPO/hack/install-deps.sh" qemu-system-x86 qemu-utils
	vm_image >/dev/null
fi

# Host paths the node mounts need as mount points: down.sh removes only
# those that did not exist before the first up.
for p in "${HOST_PATHS[@]}"; do
	[ -e "$p" ] || grep -qxF "$p" "$HOST_CREATED" 2>/dev/null || echo "$p" >>"$HOST_CREATED"
done
# Sysctls as they were before kubelet touched them; kept across repeated ups.
if [ ! -f "$SYSCTL_SAVED" ]; then
	for k in "${KUBELET_SYSCTLS[@]}"; do echo "$k=$(sysctl -n "$k")"; done >"$SYSCTL_SAVED.tmp"
	mv "$SYSCTL_SAVED.tmp" "$SYSCTL_SAVED"
fi

# --- the hub: control plane's netns, node bridge ----------------------------
if [ ! -e "/run/netns/$NETNS" ]; then
	log "hub netns $NETNS with veth $HOST_IF ($HOST_IP) <-> $NS_IF ($HUB_IP)"
	ip netns add "$NETNS"
fi
nsx() { ip netns exec "$NETNS" "$@"; }
nsx ip link set lo up
if ! ip link show "$HOST_IF" >/dev/null 2>&1; then
	ip link add "$HOST_IF" type veth peer name "$NS_IF" netns "$NETNS"
fi
ip addr replace "$HOST_IP/24" dev "$HOST_IF"
ip link set "$HOST_IF" up
nsx ip addr replace "$HUB_IP/24" dev "$NS_IF"
nsx ip link set "$NS_IF" up
nsx ip addr replace "$SERVICE_IP/32" dev lo
# The hub forwards nothing: node and pod traffic ends at the hub's own
# addresses (API server, SERVICE_IP) and never reaches the host's veth.
nsx sysctl -qw net.ipv4.ip_forward=0
nsx ip link show "$HUB_BRIDGE" >/dev/null 2>&1 || nsx ip link add "$HUB_BRIDGE" type bridge
nsx ip addr replace "$HUB_BRIDGE_IP/24" dev "$HUB_BRIDGE"
nsx ip link set "$HUB_BRIDGE" up

# --- nodes: netns, mount namespace, cgroups ----------------------------------
for i in $(node_indexes); do if node_is_vm "$i"; then vm_setup_net "$i"; else setup_node_net "$i"; fi; done
for i in $(node_indexes); do node_is_vm "$i" || setup_node_mntns "$i"; done
setup_cgroups

make_pki
# Multus (opt-in): binaries, identities, storage networks; the node configs
# below then put it in front of the pod network.
if multus_enabled; then multus_prepare; fi
write_configs
for i in $(node_indexes); do write_node_configs "$i"; done
kube_proxy_pki
for i in $(vm_indexes); do vm_write_files "$i"; done

# --- daemons -----------------------------------------------------------------
# The control plane runs in the hub netns and the host mount namespace.
start() { launch "$1" "$LOGS/$1.log" "" --net="/run/netns/$NETNS" -- "${@:2}"; }

start etcd "$KUBE_BIN/etcd" --name berth-e2e --data-dir "$WORKDIR/etcd" \
	--listen-client-urls http://127.0.0.1:2379 --advertise-client-urls http://127.0.0.1:2379 \
	--listen-peer-urls http://127.0.0.1:2380 --initial-advertise-peer-urls http://127.0.0.1:2380 \
	--initial-cluster berth-e2e=http://127.0.0.1:2380 --unsafe-no-fsync --log-level warn

start kube-apiserver "$KUBE_BIN/kube-apiserver" \
	--etcd-servers http://127.0.0.1:2379 \
	--bind-address 0.0.0.0 --advertise-address "$HUB_IP" --secure-port "$API_PORT" \
	--tls-cert-file "$PKI/apiserver.crt" --tls-private-key-file "$PKI/apiserver.key" \
	--client-ca-file "$PKI/ca.crt" \
	--kubelet-client-certificate "$PKI/apiserver-kubelet-client.crt" --kubelet-client-key "$PKI/apiserver-kubelet-client.key" \
	--kubelet-preferred-address-types InternalIP \
	--service-account-issuer https://kubernetes.default.svc.cluster.local \
	--service-account-key-file "$PKI/sa.pub" --service-account-signing-key-file "$PKI/sa.key" \
	--service-cluster-ip-range "$SERVICE_CIDR" \
	--authorization-mode Node,RBAC --enable-admission-plugins NodeRestriction \
	--allow-privileged=true --profiling=false
wait_for "API server ready" 90 kube-apiserver kctl get --raw /readyz
# Multus' CRDs and RBAC before any node runs a pod through it.
if multus_enabled; then multus_apply; fi

start kube-controller-manager "$KUBE_BIN/kube-controller-manager" \
	--kubeconfig "$CONF/controller-manager.kubeconfig" \
	--authentication-kubeconfig "$CONF/controller-manager.kubeconfig" \
	--authorization-kubeconfig "$CONF/controller-manager.kubeconfig" \
	--bind-address 127.0.0.1 --leader-elect=false --use-service-account-credentials \
	--service-account-private-key-file "$PKI/sa.key" --root-ca-file "$PKI/ca.crt" \
	--cluster-signing-cert-file "$PKI/ca.crt" --cluster-signing-key-file "$PKI/ca.key" \
	--allocate-node-cidrs=false --profiling=false

start kube-scheduler "$KUBE_BIN/kube-scheduler" \
	--kubeconfig "$CONF/scheduler.kubeconfig" \
	--authentication-kubeconfig "$CONF/scheduler.kubeconfig" \
	--authorization-kubeconfig "$CONF/scheduler.kubeconfig" \
	--bind-address 127.0.0.1 --leader-elect=false --profiling=false

# Each node: containerd, the images, kubelet; then wait for all Ready.
import_node_images() {
	IMPORT_SOCK=$(node_sock "$1")
	ctr_() { ctr -a "$IMPORT_SOCK" -n k8s.io "$@"; }
	IMPORT_NODE=$(node_name "$1") build_and_import_images
}
coredns_image
for i in $(node_indexes); do node_is_vm "$i" || start_node "$i" import_node_images; done
# A VM node: qemu boots it, the images go in through its command channel,
# its own init starts kubelet and kube-proxy.
for i in $(vm_indexes); do vm_start_node "$i"; done
for i in $(node_indexes); do node_is_vm "$i" || wait_node_ready "$i"; done
for i in $(vm_indexes); do vm_wait_ready "$i"; done
for i in $(node_indexes); do
	node_is_vm "$i" && continue
	start_kube_proxy "$(node_name "$i")" "$(node_netns "$i")" "$(node_ip "$i")" "$(node_freezer "$i")/daemons"
done
wait_for "default service account" 60 kube-controller-manager kctl -n default get serviceaccount default
"$HERE/snapshots.sh" up # VolumeSnapshot CRDs and snapshot-controller
deploy_coredns

{
	cat <<ENV
# Written by hack/cluster/up.sh; shell-sourceable KEY=value lines.
BERTH_E2E_DIR=$WORKDIR
KUBECONFIG=$KUBECONFIG_ADMIN
KUBECTL=$KUBECTL
KUBE_BIN=$KUBE_BIN
API_SERVER=$API_SERVER
KUBERNETES_SERVICE_HOST=$HUB_IP
KUBERNETES_SERVICE_PORT=$API_PORT
HUB_IP=$HUB_IP
HOST_IP=$HOST_IP
NETNS=$NETNS
SERVICE_CIDR=$SERVICE_CIDR
SERVICE_IP=$SERVICE_IP
DNS_SERVICE_IP=$DNS_SERVICE_IP
CLUSTER_DOMAIN=$CLUSTER_DOMAIN
POD_CIDR=$POD_NET
NODE_NET=$NODE_NET_PREFIX.0/24
KUBELET_ROOT=$KUBELET_ROOT
VOLUME_PLUGIN_DIR=$VOLUME_PLUGIN_DIR
BERTH_DATA_DIR=$BERTH_DATA_DIR
PAUSE_IMAGE=$PAUSE_IMAGE
BUSYBOX_IMAGE=$BUSYBOX_IMAGE
BERTH_IMAGE=${BERTH_IMAGE_TAG:-}
# Nodes: NODES lists their names; per node index I (1..NODE_COUNT) its
# IP, netns, mount namespace file (nsenter --mount=), folder on the host
# (its /var/lib/kubelet, berth-data, ... as the node sees them), containerd
# socket, pod CIDR. NODE_NAME, NODE_IP, CONTAINERD_SOCK: the first node.
ENV
	local_names=()
	for i in $(node_indexes); do local_names+=("$(node_name "$i")"); done
	multus_env
	echo "NODES=\"${local_names[*]}\""
	echo "NODE_COUNT=${#local_names[@]}"
	first=$(node_indexes | head -n1)
	echo "NODE_NAME=$(node_name "$first")"
	echo "NODE_IP=$(node_ip "$first")"
	echo "CONTAINERD_SOCK=$(node_sock "$first")"
	for i in $(node_indexes); do
		echo "NODE_NAME_$i=$(node_name "$i")"
		echo "NODE_IP_$i=$(node_ip "$i")"
		echo "NODE_NETNS_$i=$(node_netns "$i")"
		echo "NODE_MNTNS_$i=$(node_mntns "$i")"
		echo "NODE_DIR_$i=$(node_dir "$i")"
		echo "CONTAINERD_SOCK_$i=$(node_sock "$i")"
		echo "POD_CIDR_$i=$(node_pod_cidr "$i")"
		# A VM node has its own kernel: no netns or mount namespace here;
		# commands run in it through NODE_EXEC_<i>.
		if node_is_vm "$i"; then
			echo "NODE_KIND_$i=vm"
			echo "NODE_EXEC_$i=\"$REPO/hack/vm/exec.sh $(node_name "$i")\""
		else
			echo "NODE_KIND_$i=netns"
		fi
	done
} >"$WORKDIR/cluster.env.tmp"
mv "$WORKDIR/cluster.env.tmp" "$WORKDIR/cluster.env"
log "cluster up in $((SECONDS - t0))s: source $WORKDIR/cluster.env; \$KUBECTL get nodes"
