# Multus in the e2e cluster (sourced by up.sh after lib.sh, pki.sh and
# configs.sh), opt-in: BERTH_E2E_MULTUS=1 at an up (`berth dev up --multus`)
# gives the cluster, until its down:
#
#   - two storage networks, each a bridge in the hub ($PUBLIC_BRIDGE,
#     $CLUSTER_BRIDGE, no address: the hub joins nothing of them) with one
#     veth per node, whose node end ($NODE_PUBLIC_IF, $NODE_CLUSTER_IF) is
#     the macvlan master of that network in the node's netns; nothing of
#     them is routed anywhere else;
#   - the multus thin plugin as every node's CNI: its config
#     (00-multus.conf, alone in net.d) delegates each pod's first interface
#     to the existing bridge network (inline) and
#     adds the networks a pod's k8s.v1.cni.cncf.io/networks annotation
#     names, read through its own kubeconfig;
#   - whereabouts, the cluster-wide IPAM, storing allocations in IPPool
#     objects in kube-system through its own kubeconfig, named in its flat
#     file $CONF/whereabouts.conf;
#   - macvlan and the other reference plugins from Debian, all in one CNI
#     bin folder ($CNI_BIN_DIR: multus hands delegates its binDir);
#   - the NetworkAttachmentDefinition CRD (network-attachment-definition-client),
#     whereabouts' CRDs (its module's doc/crds), read from the Go module
#     cache at install time; and the definitions $NAD_NAMESPACE/public and
#     $NAD_NAMESPACE/cluster (macvlan bridge mode + whereabouts on
#     $PUBLIC_NET and $CLUSTER_NET), as a cluster admin would make them.
#
# The binaries come from hack/cni-plugins.sh (cached by version). down.sh
# needs nothing of its own for the networks: the bridges and veths go
# with the hub's and nodes' netns, the API objects with etcd.

NAD_CLIENT_MODULE=github.com/k8snetworkplumbingwg/network-attachment-definition-client
NAD_CLIENT_VERSION="${NAD_CLIENT_VERSION:-v1.7.7}"

# multus_enabled: asked for now, or by an earlier up of this cluster.
multus_enabled() { [ "${BERTH_E2E_MULTUS:-}" = 1 ] || [ -e "$MULTUS_MARK" ]; }

# multus_prepare: binaries, CNI bin folder, identities, networks. Before
# the node configs are written (they name the kubeconfig and bin folder).
multus_prepare() {
	local plugins p i
	touch "$MULTUS_MARK"
	plugins=$(ticking "building multus and whereabouts" "$REPO/hack/cni-plugins.sh" multus whereabouts | tail -n1)
	mkdir -p "$CNI_BIN_DIR"
	for p in /usr/lib/cni/*; do ln -sfn "$p" "$CNI_BIN_DIR/$(basename "$p")"; done
	# Copies, not links: the cache may be rebuilt under a running cluster.
	for p in multus whereabouts; do
		local src
		src=$(ls "$plugins/$p"-v* | head -n1)
		cmp -s "$src" "$CNI_BIN_DIR/$p" || install -m 0755 "$src" "$CNI_BIN_DIR/$p"
	done
	umask 077
	cert multus berth-e2e:multus "" clientAuth
	cert whereabouts berth-e2e:whereabouts "" clientAuth
	umask 022
	kubeconfig multus "$CONF/multus.kubeconfig"
	kubeconfig whereabouts "$CONF/whereabouts.kubeconfig"
	# whereabouts keeps its pools in the kubeconfig context's namespace.
	sed -i 's/^  context: {cluster: berth-e2e, user: whereabouts}$/  context: {cluster: berth-e2e, user: whereabouts, namespace: kube-system}/' \
		"$CONF/whereabouts.kubeconfig"
	# Its flat file: what every node's whereabouts reads beside the
	# definition's ipam section (the nodes share this one).
	printf '{"datastore": "kubernetes", "kubernetes": {"kubeconfig": "%s"}}\n' "$CONF/whereabouts.kubeconfig" >"$CONF/whereabouts.conf"
	ip -n "$NETNS" link show "$PUBLIC_BRIDGE" >/dev/null 2>&1 || ip -n "$NETNS" link add "$PUBLIC_BRIDGE" type bridge
	ip -n "$NETNS" link show "$CLUSTER_BRIDGE" >/dev/null 2>&1 || ip -n "$NETNS" link add "$CLUSTER_BRIDGE" type bridge
	ip -n "$NETNS" link set "$PUBLIC_BRIDGE" up
	ip -n "$NETNS" link set "$CLUSTER_BRIDGE" up
	for i in $(node_indexes); do
		multus_node_link "$i" "$(node_public_hub_if "$i")" "$NODE_PUBLIC_IF" "$PUBLIC_BRIDGE"
		multus_node_link "$i" "$(node_cluster_hub_if "$i")" "$NODE_CLUSTER_IF" "$CLUSTER_BRIDGE"
	done
}

# multus_node_link I HUB_IF NODE_IF BRIDGE: a veth from BRIDGE in the hub
# to NODE_IF in node I's netns, up, no address (macvlan's master).
multus_node_link() {
	local ns
	ns=$(node_netns "$1")
	ip -n "$NETNS" link show "$2" >/dev/null 2>&1 || ip -n "$NETNS" link add "$2" type veth peer name "$3" netns "$ns"
	ip -n "$NETNS" link set "$2" master "$4" up
	ip -n "$ns" link set "$3" up
}

# multus_node_conf I: node I's CNI config with multus in front of the
# pod network (write_node_configs wrote that network to net.d first): the
# network goes inline as multus' delegate, the only file left in net.d is
# multus'. (With the network as a clusterNetwork file, multus v4.2.2
# caches a copy of it that has lost all but the plugin types, and every
# pod's DEL fails: "bridge failed (delete): no IP ranges specified".)
multus_node_conf() {
	local dir net
	dir=$(node_dir "$1")
	net="$dir/cni-conf/net.d"
	cat >"$net/00-multus.conf.tmp" <<JSON
{
  "cniVersion": "0.4.0",
  "name": "multus-cni-network",
  "type": "multus",
  "kubeconfig": "$CONF/multus.kubeconfig",
  "delegates": [$(cat "$net/10-berth-e2e.conflist")],
  "confDir": "$net",
  "binDir": "$CNI_BIN_DIR",
  "cniDir": "/var/lib/cni/multus",
  "logFile": "$dir/logs/multus.log",
  "logLevel": "verbose",
  "logToStderr": false
}
JSON
	rm -f "$net/10-berth-e2e.conflist"
	mv -f "$net/00-multus.conf.tmp" "$net/00-multus.conf"
}

# multus_nad_config NET_PREFIX MASTER: the CNI config of a storage network:
# macvlan (bridge mode: pods on one node reach each other too) on MASTER,
# whereabouts from .10 of the /24. whereabouts v0.8.0 refuses to run
# without its flat file (configuration_path; the kubeconfig is there).
multus_nad_config() {
	printf '{"cniVersion": "0.4.0", "type": "macvlan", "master": "%s", "mode": "bridge", "ipam": {"type": "whereabouts", "range": "%s.0/24", "range_start": "%s.10", "configuration_path": "%s"}}' \
		"$2" "$1" "$1" "$CONF/whereabouts.conf"
}

# multus_apply: CRDs, RBAC and the two definitions. Once the API server
# is ready, before any node starts a pod.
multus_apply() {
	local nad wb u
	nad=$(module_dir "$NAD_CLIENT_MODULE@$NAD_CLIENT_VERSION")
	wb=$(module_dir "$("$REPO/hack/cni-plugins.sh" --module whereabouts)")
	log "multus: NetworkAttachmentDefinition CRD ($NAD_CLIENT_MODULE@$NAD_CLIENT_VERSION), whereabouts CRDs, RBAC"
	kctl apply -f "$nad/artifacts/networks-crd.yaml" \
		-f "$wb/doc/crds/whereabouts.cni.cncf.io_ippools.yaml" \
		-f "$wb/doc/crds/whereabouts.cni.cncf.io_overlappingrangeipreservations.yaml" >/dev/null
	kctl wait --for condition=established --timeout 60s \
		crd/network-attachment-definitions.k8s.cni.cncf.io crd/ippools.whereabouts.cni.cncf.io \
		crd/overlappingrangeipreservations.whereabouts.cni.cncf.io >/dev/null
	# What each plugin does through the API, as upstream's manifests grant
	# it, to the users of their certificates.
	kctl apply -f - >/dev/null <<YAML
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: "berth-e2e:multus"}
rules:
- apiGroups: [k8s.cni.cncf.io]
  resources: [network-attachment-definitions]
  verbs: [get, list, watch]
- apiGroups: [""]
  resources: [pods, pods/status]
  verbs: [get, update]
- apiGroups: ["", events.k8s.io]
  resources: [events]
  verbs: [create, patch, update]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: "berth-e2e:whereabouts"}
rules:
- apiGroups: [whereabouts.cni.cncf.io]
  resources: [ippools, overlappingrangeipreservations]
  verbs: [get, list, watch, create, update, patch, delete]
- apiGroups: [coordination.k8s.io]
  resources: [leases]
  verbs: [get, list, watch, create, update, patch, delete]
- apiGroups: [""]
  resources: [pods]
  verbs: [get, list, watch]
- apiGroups: [""]
  resources: [nodes]
  verbs: [get]
- apiGroups: ["", events.k8s.io]
  resources: [events]
  verbs: [create, patch, update, get]
YAML
	for u in berth-e2e:multus berth-e2e:whereabouts; do
		kctl create clusterrolebinding "$u" --clusterrole "$u" --user "$u" --dry-run=client -o yaml | kctl apply -f - >/dev/null
	done
	kctl apply -f - >/dev/null <<YAML
apiVersion: k8s.cni.cncf.io/v1
kind: NetworkAttachmentDefinition
metadata: {name: public, namespace: $NAD_NAMESPACE}
spec:
  config: '$(multus_nad_config "$PUBLIC_NET_PREFIX" "$NODE_PUBLIC_IF")'
---
apiVersion: k8s.cni.cncf.io/v1
kind: NetworkAttachmentDefinition
metadata: {name: cluster, namespace: $NAD_NAMESPACE}
spec:
  config: '$(multus_nad_config "$CLUSTER_NET_PREFIX" "$NODE_CLUSTER_IF")'
YAML
}

# multus_env: cluster.env lines (MULTUS=0 when off).
multus_env() {
	if ! multus_enabled; then
		echo "MULTUS=0"
		return
	fi
	cat <<ENV
MULTUS=1
PUBLIC_NAD=$NAD_NAMESPACE/public
CLUSTER_NAD=$NAD_NAMESPACE/cluster
PUBLIC_NET=$PUBLIC_NET_PREFIX.0/24
CLUSTER_NET=$CLUSTER_NET_PREFIX.0/24
NODE_PUBLIC_IF=$NODE_PUBLIC_IF
NODE_CLUSTER_IF=$NODE_CLUSTER_IF
CEPH_NETNS=$E2E_CEPH_NETNS
CEPH_PUBLIC_IP=$E2E_CEPH_PUBLIC_IP
CEPH_CLUSTER_IP=$E2E_CEPH_CLUSTER_IP
ENV
}
