# Config files of the e2e cluster's daemons (sourced by up.sh); rewritten on
# every up, so that a change here applies at the next start.

# kubeconfig NAME: client NAME's certificate against the API server.
kubeconfig() {
	local name=$1 out=$2
	cat >"$out" <<YAML
apiVersion: v1
kind: Config
clusters:
- name: berth-e2e
  cluster:
    server: $API_SERVER
    certificate-authority: $PKI/ca.crt
users:
- name: $name
  user:
    client-certificate: $PKI/$name.crt
    client-key: $PKI/$name.key
contexts:
- name: berth-e2e
  context: {cluster: berth-e2e, user: $name}
current-context: berth-e2e
YAML
}

write_configs() {
	kubeconfig admin "$KUBECONFIG_ADMIN"
	kubeconfig controller-manager "$CONF/controller-manager.kubeconfig"
	kubeconfig scheduler "$CONF/scheduler.kubeconfig"
}

# write_node_configs I: kubeconfig, CNI, containerd and kubelet config of
# node I, all under the node's folder.
write_node_configs() {
	local i=$1 name dir ip cidr sock
	name=$(node_name "$i") dir=$(node_dir "$i") ip=$(node_ip "$i") cidr=$(node_pod_cidr "$i") sock=$(node_sock "$i")
	local cni="$dir/cni-conf" containerd="$dir/containerd" conf="$dir/config"
	mkdir -p "$cni/net.d" "$containerd" "$conf"
	kubeconfig "kubelet-$name" "$conf/kubelet.kubeconfig"

	# Bridge on the node's pod CIDR inside its netns; no masquerade (nothing
	# may leave). Pods get routes to the hub and the node network (API
	# server, node IPs), the other nodes' pods and the Service CIDR (the API
	# server answers on SERVICE_IP), no default route.
	cat >"$cni/net.d/10-berth-e2e.conflist" <<JSON
{
  "cniVersion": "0.4.0",
  "name": "berth-e2e",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "$BRIDGE",
      "isGateway": true,
      "ipMasq": false,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "ranges": [[{"subnet": "$cidr"}]],
        "routes": [{"dst": "$HUB_IP/32"}, {"dst": "$NODE_NET_PREFIX.0/24"}, {"dst": "$POD_NET"}, {"dst": "$SERVICE_CIDR"}],
        "dataDir": "$dir/cni-ipam"
      }
    }
  ]
}
JSON
	local bin_dir=/usr/lib/cni
	if multus_enabled; then
		multus_node_conf "$i"
		bin_dir=$CNI_BIN_DIR
	else
		rm -f "$cni/net.d/00-multus.conf"
	fi

	# restrict_oom_score_adj: this machine lacks CAP_SYS_RESOURCE.
	# netns_mounts_under_state_dir and the runc Root keep every mount and
	# state file under the node's folder, where down.sh sweeps.
	cat >"$conf/containerd.toml" <<TOML
version = 2
root = "$containerd/root"
state = "$containerd/state"
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.tracing.processor.v1.otlp"]

[grpc]
  address = "$sock"

[plugins."io.containerd.internal.v1.opt"]
  path = "$containerd/opt"

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$PAUSE_IMAGE"
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  stream_server_address = "127.0.0.1"
  enable_selinux = false
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        BinaryName = "$(command -v runc)"
        Root = "$containerd/runc"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "$bin_dir"
    conf_dir = "$cni/net.d"
    max_conf_num = 1
TOML

	# failCgroupV1/cgroupDriver/failSwapOn/makeIPTablesUtilChains: this
	# machine (cgroup v1, swap, no iptables rules wanted). Image GC off: the
	# images are imported, never pulled back. Eviction thresholds low: a
	# busy build machine must not evict test pods. syncFrequency 10s (1m by
	# default): kubelet looks at a running pod's volumes for an online
	# expansion only when it syncs the pod, and the e2e scenarios waited a
	# minute for that each time (a VM node keeps the default: vm.sh).
	cat >"$conf/kubelet.yaml" <<YAML
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
failCgroupV1: false
cgroupDriver: cgroupfs
cgroupRoot: /$(node_cgroup "$i")
failSwapOn: false
makeIPTablesUtilChains: false
syncFrequency: 10s
containerRuntimeEndpoint: unix://$sock
address: $ip
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: $PKI/ca.crt}
authorization: {mode: Webhook}
clusterDomain: $CLUSTER_DOMAIN
clusterDNS: [$DNS_SERVICE_IP]
resolvConf: ""
volumePluginDir: $VOLUME_PLUGIN_DIR
podLogsDir: $dir/pod-logs
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard:
  memory.available: 50Mi
  nodefs.available: 1%
  imagefs.available: 1%
  nodefs.inodesFree: 1%
serializeImagePulls: false
registerNode: true
rotateCertificates: false
YAML
}
