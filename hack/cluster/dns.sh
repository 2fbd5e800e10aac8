# Service proxying and cluster DNS of the e2e cluster, as every real cluster
# has them (sourced by up.sh and down.sh after lib.sh):
#
#   - kube-proxy, one plain process per node inside that node's netns
#     (iptables mode: Debian's iptables; rules live in the netns and go
#     with it), user system:kube-proxy, so the built-in
#     system:node-proxier binding is its whole RBAC;
#   - CoreDNS (built by hack/coredns.sh, image $COREDNS_IMAGE), a
#     Deployment behind the kube-dns Service at $DNS_SERVICE_IP, answering
#     for $CLUSTER_DOMAIN and the reverse zones only: no forward, so no
#     query ever leaves the machine; every other name gets REFUSED.
#
# Functions take the node as arguments so that a multi-node up.sh calls
# them once per node.

COREDNS_VERSION="${COREDNS_VERSION:-v1.12.4}"
COREDNS_IMAGE="berth.local/coredns:$COREDNS_VERSION"
DNS_SERVICE_IP="${BERTH_E2E_DNS_SERVICE_IP:-10.252.0.10}"
CLUSTER_DOMAIN=cluster.local
# Traffic to a Service from outside this range is masqueraded.
CLUSTER_CIDR="${BERTH_E2E_CLUSTER_CIDR:-$POD_NET}"
# kube_proxy_pki: one client certificate for every node's kube-proxy.
kube_proxy_pki() {
	umask 077
	cert kube-proxy system:kube-proxy "" clientAuth
	umask 022
	kubeconfig kube-proxy "$CONF/kube-proxy.kubeconfig"
}

# start_kube_proxy NODE NETNS NODE_IP [CGROUP]: kube-proxy of NODE, inside
# NETNS (and the freezer cgroup CGROUP, so that a lost node loses it too),
# bound to NODE_IP and 127.0.0.1 only; returns once it has written the
# rules of the kubernetes Service. The node's route to the Service CIDR
# (via the hub, nodes.sh) lets kube-proxy's OUTPUT rules DNAT a hostNetwork
# process's packets; the hub's SERVICE_IP on lo still answers for
# 10.252.0.1 before kube-proxy's first sync.
start_kube_proxy() {
	local node=$1 netns=$2 node_ip=$3 cg=${4:-} cfg="$CONF/kube-proxy-$1.yaml" pid
	# kube-proxy exits when its config file is written (it watches the
	# file): a second start of a running node (a test's cleanup after its
	# own start) must not touch it, or the node is left without kube-proxy
	# and its Service rules go stale (cluster DNS unanswered there).
	if pid=$(pid_of "kube-proxy-$node"); then
		log "kube-proxy-$node already runs (pid $pid)"
		return 0
	fi
	# conntrack: every 0 leaves the kernel's value alone (nf_conntrack_max
	# and hashsize are global; the timeouts are per netns but need no tuning).
	# oomScoreAdj 0: lowering it needs CAP_SYS_RESOURCE, absent here.
	cat >"$cfg" <<YAML
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection:
  kubeconfig: $CONF/kube-proxy.kubeconfig
hostnameOverride: $node
mode: iptables
bindAddress: $node_ip
healthzBindAddress: 127.0.0.1:10256
metricsBindAddress: 127.0.0.1:10249
nodePortAddresses: [$node_ip/32]
clusterCIDR: $CLUSTER_CIDR
detectLocalMode: ClusterCIDR
oomScoreAdj: 0
iptables:
  localhostNodePorts: false
  masqueradeAll: false
conntrack:
  maxPerCore: 0
  min: 0
  tcpEstablishedTimeout: 0s
  tcpCloseWaitTimeout: 0s
  udpTimeout: 0s
  udpStreamTimeout: 0s
YAML
	launch "kube-proxy-$node" "$LOGS/kube-proxy-$node.log" "$cg" --net="/run/netns/$netns" -- \
		"$KUBE_BIN/kube-proxy" --config "$cfg" --v 1
	wait_for "kube-proxy of $node: kubernetes Service rules" 60 "kube-proxy-$node" \
		sh -c "nsenter --net=/run/netns/$netns -- iptables -w -t nat -S KUBE-SERVICES | grep -q 'default/kubernetes:https'"
}

# stop_kube_proxies: every node's kube-proxy (their rules go with the netns).
stop_kube_proxies() {
	local f name pid
	for f in "$PIDS"/kube-proxy-*.pid; do
		[ -e "$f" ] || continue
		name=$(basename "$f" .pid)
		if pid=$(pid_of "$name"); then log "stopping $name ($pid)"; stop_pid "$pid"; fi
	done
}

# coredns_image: builds CoreDNS (cached) and lists its image for
# build_and_import_images, which imports it on the node.
coredns_image() {
	local bin
	bin=$(ticking "building CoreDNS" "$REPO/hack/coredns.sh" | tail -n1)
	BINARY_IMAGES+=("coredns=$COREDNS_IMAGE=$bin")
}

# deploy_coredns: CoreDNS and the kube-dns Service; returns once a replica
# answers (ready).
deploy_coredns() {
	log "CoreDNS $COREDNS_VERSION at $DNS_SERVICE_IP (kube-dns, zones $CLUSTER_DOMAIN in-addr.arpa ip6.arpa)"
	kctl apply -f - >/dev/null <<YAML
apiVersion: v1
kind: ServiceAccount
metadata: {name: coredns, namespace: kube-system}
---
# What the kubernetes plugin watches, read-only, and nothing else (pods
# are not watched: "pods insecure" needs no pod list).
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: "system:coredns"}
rules:
- apiGroups: [""]
  resources: [services, namespaces]
  verbs: [list, watch]
- apiGroups: [discovery.k8s.io]
  resources: [endpointslices]
  verbs: [list, watch]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: "system:coredns"}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: "system:coredns"}
subjects:
- {kind: ServiceAccount, name: coredns, namespace: kube-system}
---
# No forward: tests may not send traffic off the machine. Other names get
# REFUSED (not this server's zones) at once instead of a timeout.
apiVersion: v1
kind: ConfigMap
metadata: {name: coredns, namespace: kube-system}
data:
  Corefile: |
    $CLUSTER_DOMAIN:53 in-addr.arpa:53 ip6.arpa:53 {
        errors
        health {
            lameduck 5s
        }
        ready
        kubernetes $CLUSTER_DOMAIN in-addr.arpa ip6.arpa {
            pods insecure
            ttl 30
        }
        prometheus :9153
        cache 30
        reload
        loadbalance
    }
---
apiVersion: apps/v1
kind: Deployment
metadata:
  name: coredns
  namespace: kube-system
  labels: {k8s-app: kube-dns}
spec:
  replicas: 2
  selector:
    matchLabels: {k8s-app: kube-dns}
  strategy:
    rollingUpdate: {maxUnavailable: 1}
  template:
    metadata:
      labels: {k8s-app: kube-dns}
    spec:
      serviceAccountName: coredns
      priorityClassName: system-cluster-critical
      dnsPolicy: Default
      tolerations:
      - {key: CriticalAddonsOnly, operator: Exists}
      affinity:
$(vm_deployment_affinity "        ")
        podAntiAffinity:
          preferredDuringSchedulingIgnoredDuringExecution:
          - weight: 100
            podAffinityTerm:
              topologyKey: kubernetes.io/hostname
              labelSelector:
                matchLabels: {k8s-app: kube-dns}
      containers:
      - name: coredns
        image: $COREDNS_IMAGE
        imagePullPolicy: Never
        args: [-conf, /etc/coredns/Corefile]
        ports:
        - {name: dns, containerPort: 53, protocol: UDP}
        - {name: dns-tcp, containerPort: 53, protocol: TCP}
        - {name: metrics, containerPort: 9153, protocol: TCP}
        resources:
          requests: {cpu: 10m, memory: 20Mi}
          limits: {memory: 100Mi}
        securityContext:
          allowPrivilegeEscalation: false
          readOnlyRootFilesystem: true
          capabilities: {add: [NET_BIND_SERVICE], drop: [ALL]}
        livenessProbe:
          httpGet: {path: /health, port: 8080}
          periodSeconds: 10
          failureThreshold: 5
        readinessProbe:
          httpGet: {path: /ready, port: 8181}
          periodSeconds: 2
        volumeMounts:
        - {name: config, mountPath: /etc/coredns, readOnly: true}
      volumes:
      - name: config
        configMap:
          name: coredns
          items: [{key: Corefile, path: Corefile}]
---
apiVersion: v1
kind: Service
metadata:
  name: kube-dns
  namespace: kube-system
  labels: {k8s-app: kube-dns, kubernetes.io/name: CoreDNS}
spec:
  selector: {k8s-app: kube-dns}
  clusterIP: $DNS_SERVICE_IP
  ports:
  - {name: dns, port: 53, protocol: UDP}
  - {name: dns-tcp, port: 53, protocol: TCP}
  - {name: metrics, port: 9153, protocol: TCP}
YAML
	wait_for "CoreDNS ready" 120 "" \
		kctl -n kube-system rollout status deployment/coredns --timeout=2s
}

# remove_coredns: the Deployment goes before down.sh deletes every pod, or
# its ReplicaSet would bring the pods back.
remove_coredns() {
	kctl -n kube-system delete deployment coredns --ignore-not-found --wait=false >/dev/null 2>&1 || true
}
