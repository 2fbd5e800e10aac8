#!/usr/bin/env bash
# Brings up a single-node Kubernetes for berth's end-to-end tests, every
# process inside the network namespace $NETNS so that no test traffic leaves
# it (the host reaches the API server over a private veth pair only).
#
#   hack/cluster/up.sh          idempotent: a second run finds what runs
#
# Writes $WORKDIR/cluster.env (KUBECONFIG, KUBELET_ROOT, VOLUME_PLUGIN_DIR,
# NODE_NAME, CONTAINERD_SOCK, API_SERVER, ...). Stop with hack/cluster/down.sh.
# Set BERTH_E2E_BERTH_BINARY to a static berth binary to also build and
# import the berth image (tag berth.local/berth:dev).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
# shellcheck source=lib.sh
. "$HERE/lib.sh"
. "$HERE/pki.sh"
. "$HERE/configs.sh"
. "$HERE/images.sh"

[ "$(id -u)" -eq 0 ] || die "run as root (netns, mounts, cgroups)"
t0=$SECONDS

log "packages: containerd runc containernetworking-plugins busybox-static openssl"
"$REPO/hack/install-deps.sh" containerd runc containernetworking-plugins busybox-static openssl iproute2 util-linux

log "kube binaries (cached by version; a cold build takes minutes)"
KUBE_BIN=$(ticking "building kube binaries" "$REPO/hack/kube-binaries.sh" \
	etcd kube-apiserver kube-controller-manager kube-scheduler kubelet kubectl | tail -n1)
KUBECTL="$KUBE_BIN/kubectl"

mkdir -p "$WORKDIR" "$PKI" "$CONF" "$LOGS" "$PIDS" "$IMAGES" "$POD_LOGS" "$CNI_DIR/net.d" "$CNI_DIR/ipam" \
	"$CONTAINERD_DIR" "$KUBELET_ROOT" "$VOLUME_PLUGIN_DIR" "$WORKDIR/bin"

echo "$KUBE_BIN" >"$WORKDIR/kube-bin"

# Host paths that kubelet/containerd create: down.sh removes only those that
# did not exist before the first up.
for p in "${HOST_PATHS[@]}"; do
	[ -e "$p" ] || grep -qxF "$p" "$HOST_CREATED" 2>/dev/null || echo "$p" >>"$HOST_CREATED"
done
for d in "${SHARED_DIRS[@]}"; do
	mkdir -p "$d"
	mountpoint -q "$d" || mount --bind "$d" "$d"
	mount --make-shared "$d"
done
# Sysctls as they were before kubelet touched them; kept across repeated ups.
if [ ! -f "$SYSCTL_SAVED" ]; then
	for k in "${KUBELET_SYSCTLS[@]}"; do echo "$k=$(sysctl -n "$k")"; done >"$SYSCTL_SAVED.tmp"
	mv "$SYSCTL_SAVED.tmp" "$SYSCTL_SAVED"
fi

# --- network namespace -------------------------------------------------------
if [ ! -e "/run/netns/$NETNS" ]; then
	log "netns $NETNS with veth $HOST_IF ($HOST_IP) <-> $NS_IF ($NODE_IP)"
	ip netns add "$NETNS"
fi
nsx() { ip netns exec "$NETNS" "$@"; }
nsx ip link set lo up
if ! ip link show "$HOST_IF" >/dev/null 2>&1; then
	ip link add "$HOST_IF" type veth peer name "$NS_IF" netns "$NETNS"
fi
ip addr replace "$HOST_IP/24" dev "$HOST_IF"
ip link set "$HOST_IF" up
nsx ip addr replace "$NODE_IP/24" dev "$NS_IF"
nsx ip link set "$NS_IF" up
nsx ip addr replace "$SERVICE_IP/32" dev lo
# The pod bridge enables forwarding in the netns; nothing from a pod may be
# forwarded to the host over the veth (its replies would leave by the host's
# default route). Local addresses match the local table first and stay open.
if ! nsx ip rule show | grep -q "iif $BRIDGE .*prohibit"; then
	nsx ip rule add pref 100 iif "$BRIDGE" to "$HOST_IP/24" prohibit
fi

# --- cgroups: one subtree per v1 hierarchy, the kubelet's cgroupRoot ---------
for c in /sys/fs/cgroup/*/; do
	c=${c%/}
	[ "$(basename "$c")" = unified ] && continue
	mountpoint -q "$c" || continue
	mkdir -p "$c/$CGROUP_NAME"
	if [ -f "$c/cpuset.cpus" ] && [ -z "$(cat "$c/$CGROUP_NAME/cpuset.cpus")" ]; then
		cat "$c/cpuset.cpus" >"$c/$CGROUP_NAME/cpuset.cpus"
		cat "$c/cpuset.mems" >"$c/$CGROUP_NAME/cpuset.mems"
	fi
done

make_pki
write_configs

# --- daemons -----------------------------------------------------------------
# start NAME BINARY ARGS...: runs BINARY inside the netns, detached, once.
# nsenter (not `ip netns exec`) keeps the host mount namespace: kubelet's
# volume mounts must be visible to containerd and to down.sh.
start() {
	local name=$1 bin=$2 pid
	shift 2
	if pid=$(pid_of "$name"); then
		log "$name already runs (pid $pid)"
		return 0
	fi
	log "starting $name (log $LOGS/$name.log)"
	[ -f "$LOGS/$name.log" ] && mv -f "$LOGS/$name.log" "$LOGS/$name.log.prev"
	setsid nsenter --net="/run/netns/$NETNS" -- "$bin" "$@" </dev/null >"$LOGS/$name.log" 2>&1 &
	printf '%s\n%s\n' "$!" "$(readlink -f "$bin")" >"$PIDS/$name.pid"
}

# wait_for WHAT SECONDS DAEMON CMD...: polls CMD, printing progress, failing
# early when DAEMON died.
wait_for() {
	local what=$1 limit=$2 daemon=$3 start=$SECONDS next=$((SECONDS + 5))
	shift 3
	until "$@" >/dev/null 2>&1; do
		if [ -n "$daemon" ] && ! pid_of "$daemon" >/dev/null; then
			tail -n 20 "$LOGS/$daemon.log" >&2 || true
			die "$daemon exited while waiting for $what"
		fi
		((SECONDS - start < limit)) || { tail -n 20 "$LOGS/$daemon.log" >&2 || true; die "timeout waiting for $what"; }
		if ((SECONDS >= next)); then
			log "  still waiting for $what ($((SECONDS - start))s)"
			next=$((SECONDS + 5))
		fi
		sleep 0.3
	done
	log "$what after $((SECONDS - start))s"
}

start etcd "$KUBE_BIN/etcd" --name berth-e2e --data-dir "$WORKDIR/etcd" \
	--listen-client-urls http://127.0.0.1:2379 --advertise-client-urls http://127.0.0.1:2379 \
	--listen-peer-urls http://127.0.0.1:2380 --initial-advertise-peer-urls http://127.0.0.1:2380 \
	--initial-cluster berth-e2e=http://127.0.0.1:2380 --unsafe-no-fsync --log-level warn

start kube-apiserver "$KUBE_BIN/kube-apiserver" \
	--etcd-servers http://127.0.0.1:2379 \
	--bind-address 0.0.0.0 --advertise-address "$NODE_IP" --secure-port "$API_PORT" \
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

start containerd "$(command -v containerd)" --config "$CONF/containerd.toml"
ctr_() { ctr -a "$CONTAINERD_SOCK" -n k8s.io "$@"; }
wait_for "containerd ready" 60 containerd ctr -a "$CONTAINERD_SOCK" version

build_and_import_images

start kubelet "$KUBE_BIN/kubelet" \
	--config "$CONF/kubelet.yaml" --kubeconfig "$CONF/kubelet.kubeconfig" \
	--root-dir "$KUBELET_ROOT" --cert-dir "$KUBELET_ROOT/pki" \
	--hostname-override "$NODE_NAME" --node-ip "$NODE_IP" --v 1
wait_for "node $NODE_NAME Ready" 120 kubelet \
	sh -c "'$KUBECTL' --kubeconfig '$KUBECONFIG_ADMIN' get node '$NODE_NAME' -o jsonpath='{.status.conditions[?(@.type==\"Ready\")].status}' | grep -qx True"
wait_for "default service account" 60 kube-controller-manager kctl -n default get serviceaccount default
"$HERE/snapshots.sh" up # VolumeSnapshot CRDs and snapshot-controller

cat >"$WORKDIR/cluster.env.tmp" <<ENV
# Written by hack/cluster/up.sh; shell-sourceable KEY=value lines.
BERTH_E2E_DIR=$WORKDIR
KUBECONFIG=$KUBECONFIG_ADMIN
KUBECTL=$KUBECTL
KUBE_BIN=$KUBE_BIN
API_SERVER=$API_SERVER
KUBERNETES_SERVICE_HOST=$NODE_IP
KUBERNETES_SERVICE_PORT=$API_PORT
NODE_NAME=$NODE_NAME
NODE_IP=$NODE_IP
HOST_IP=$HOST_IP
NETNS=$NETNS
KUBELET_ROOT=$KUBELET_ROOT
VOLUME_PLUGIN_DIR=$VOLUME_PLUGIN_DIR
BERTH_DATA_DIR=$BERTH_DATA_DIR
CONTAINERD_SOCK=$CONTAINERD_SOCK
PAUSE_IMAGE=$PAUSE_IMAGE
BUSYBOX_IMAGE=$BUSYBOX_IMAGE
BERTH_IMAGE=${BERTH_IMAGE_TAG:-}
ENV
mv "$WORKDIR/cluster.env.tmp" "$WORKDIR/cluster.env"
log "cluster up in $((SECONDS - t0))s: source $WORKDIR/cluster.env; \$KUBECTL get nodes"
