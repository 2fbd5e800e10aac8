#!/usr/bin/env bash
# The VolumeSnapshot API of the e2e cluster, as a distribution ships it: the
# snapshot.storage.k8s.io CRDs and the snapshot-controller that turns a
# VolumeSnapshot into a VolumeSnapshotContent for a CSI driver's snapshotter
# sidecar (berth's runs beside its CSI controller).
#
#   hack/cluster/snapshots.sh up     (up.sh, once the node is Ready)
#   hack/cluster/snapshots.sh down   (down.sh, before it deletes the pods)
#
# Both come from external-snapshotter v8 ($SNAPSHOTTER_VERSION, the version
# of berth's csi-snapshotter sidecar), from the Go module proxy: the
# controller built by hack/csi-sidecars.sh (image
# berth.local/snapshot-controller:VERSION), the CRDs read at install time
# from the module cache, from the client module that controller is built
# with. Their API objects live in etcd, which down.sh removes. Set
# BERTH_E2E_SNAPSHOTS=0 to leave them out.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
# shellcheck source=lib.sh
. "$HERE/lib.sh"
# shellcheck source=../vm/vm.sh
. "$HERE/../vm/vm.sh"

SNAPSHOTTER_VERSION="${SNAPSHOTTER_VERSION:-v8.3.0}"
SNAPSHOTTER_MODULE=github.com/kubernetes-csi/external-snapshotter/v8
CLIENT_MODULE=github.com/kubernetes-csi/external-snapshotter/client/v8
CONTROLLER_IMAGE="berth.local/snapshot-controller:$SNAPSHOTTER_VERSION"
CONTROLLER_NS=kube-system
CRDS=(volumesnapshotclasses volumesnapshotcontents volumesnapshots)

[ "$(id -u)" -eq 0 ] || die "run as root"
KUBECTL=
[ -f "$WORKDIR/kube-bin" ] && KUBECTL="$(cat "$WORKDIR/kube-bin")/kubectl"

# crd_dir: client/config/crd of the client module external-snapshotter
# requires. Its own ./client replace is not in the downloaded module (a
# nested module), so the controller is built against this version, and
# these CRDs are the schema its types were made for.
crd_dir() {
	local main client
	main=$(module_dir "$SNAPSHOTTER_MODULE@$SNAPSHOTTER_VERSION")
	client=$(awk -v m="$CLIENT_MODULE" '$1 == m && $2 ~ /^v/ {print $2; exit}' "$main/go.mod")
	[ -n "$client" ] || die "$SNAPSHOTTER_MODULE@$SNAPSHOTTER_VERSION requires no $CLIENT_MODULE"
	log "snapshot CRDs from $CLIENT_MODULE@$client (required by $SNAPSHOTTER_MODULE@$SNAPSHOTTER_VERSION)"
	echo "$(module_dir "$CLIENT_MODULE@$client")/config/crd"
}

# image: builds (cached) the controller and imports its image once per build.
image() {
	local dir bin tar="$IMAGES/snapshot-controller.tar" tool="$WORKDIR/bin/images"
	dir=$(ticking "building snapshot-controller" "$REPO/hack/csi-sidecars.sh" snapshot-controller | tail -n1)
	bin="$dir/snapshot-controller-$SNAPSHOTTER_VERSION"
	[ -x "$tool" ] || die "$tool missing: up.sh builds it"
	if [ ! -e "$tar" ] || [ -n "$(find "$bin" "$tool" -newer "$tar" -print -quit)" ]; then
		"$tool" -out "$IMAGES" -busybox "" -binary "snapshot-controller=$CONTROLLER_IMAGE=$bin"
	fi
	# Into every node the scheduler may place the controller on: not a VM
	# node while a netns node is there (vm.sh).
	local i mark
	for i in $(node_indexes); do
		if node_is_vm "$i" && vm_keep_deployments_off; then continue; fi
		local ctr_=(ctr -a "$(node_sock "$i")" -n k8s.io)
		# A VM node's containerd answers through its command channel.
		if node_is_vm "$i"; then ctr_=(vm_ctr "$i"); fi
		mark="$tar.imported.$(node_name "$i")"
		# grep without -q: under pipefail, a ctr cut off by SIGPIPE would read as "not imported".
		if ! "${ctr_[@]}" images ls -q | grep -xF "$CONTROLLER_IMAGE" >/dev/null || [ "$tar" -nt "$mark" ]; then
			log "importing $CONTROLLER_IMAGE into $(node_name "$i")"
			"${ctr_[@]}" images import --platform linux/amd64 "$tar" >/dev/null
			touch "$mark"
		fi
	done
}

# The controller's rules: upstream's deploy/kubernetes/snapshot-controller
# RBAC without the group-snapshot rules (the CSIVolumeGroupSnapshot gate is
# off) and without leases (one replica, no leader election), each verb one
# that its v1 code calls.
manifest() {
	cat <<YAML
apiVersion: v1
kind: ServiceAccount
metadata: {name: snapshot-controller, namespace: $CONTROLLER_NS}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: berth-e2e:snapshot-controller}
rules:
- apiGroups: [""]
  resources: [persistentvolumes]
  verbs: [get, list, watch]
- apiGroups: [""]
  resources: [persistentvolumeclaims]
  verbs: [get, list, watch, update]
- apiGroups: [""]
  resources: [events]
  verbs: [create, update, patch]
- apiGroups: [snapshot.storage.k8s.io]
  resources: [volumesnapshotclasses]
  verbs: [get, list, watch]
- apiGroups: [snapshot.storage.k8s.io]
  resources: [volumesnapshots]
  verbs: [get, list, watch, update, patch]
- apiGroups: [snapshot.storage.k8s.io]
  resources: [volumesnapshots/status]
  verbs: [update, patch]
- apiGroups: [snapshot.storage.k8s.io]
  resources: [volumesnapshotcontents]
  verbs: [get, list, watch, create, update, patch, delete]
- apiGroups: [snapshot.storage.k8s.io]
  resources: [volumesnapshotcontents/status]
  verbs: [patch]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: berth-e2e:snapshot-controller}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: berth-e2e:snapshot-controller}
subjects:
- {kind: ServiceAccount, name: snapshot-controller, namespace: $CONTROLLER_NS}
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: snapshot-controller, namespace: $CONTROLLER_NS}
spec:
  replicas: 1
  # Never two at once: no leader election.
  strategy: {type: Recreate}
  selector:
    matchLabels: {app.kubernetes.io/name: snapshot-controller}
  template:
    metadata:
      labels: {app.kubernetes.io/name: snapshot-controller}
    spec:
      serviceAccountName: snapshot-controller
      # No kube-proxy here: from every node's network the "kubernetes"
      # Service address (in-cluster config) routes to the API server (lib.sh).
      hostNetwork: true
      priorityClassName: system-cluster-critical
      terminationGracePeriodSeconds: 5
      affinity:
$(vm_deployment_affinity "        ")
      securityContext:
        runAsNonRoot: true
        runAsUser: 65534
        runAsGroup: 65534
        seccompProfile: {type: RuntimeDefault}
      containers:
      - name: snapshot-controller
        image: $CONTROLLER_IMAGE
        imagePullPolicy: Never
        args: [--v=2]
        securityContext:
          allowPrivilegeEscalation: false
          readOnlyRootFilesystem: true
          capabilities: {drop: [ALL]}
        resources:
          requests: {cpu: 10m, memory: 32Mi}
YAML
}

up() {
	if [ "${BERTH_E2E_SNAPSHOTS:-1}" = 0 ]; then
		log "BERTH_E2E_SNAPSHOTS=0: no VolumeSnapshot API"
		return 0
	fi
	local t0=$SECONDS dir c
	[ -x "$KUBECTL" ] || die "no cluster: run hack/cluster/up.sh"
	dir=$(crd_dir)
	for c in "${CRDS[@]}"; do
		[ -f "$dir/snapshot.storage.k8s.io_$c.yaml" ] || die "$dir has no snapshot.storage.k8s.io_$c.yaml"
		kctl apply --server-side --field-manager=berth-e2e --force-conflicts \
			-f "$dir/snapshot.storage.k8s.io_$c.yaml" >/dev/null
	done
	for c in "${CRDS[@]}"; do
		kctl wait --for condition=established --timeout=60s "crd/$c.snapshot.storage.k8s.io" >/dev/null
	done
	image
	manifest | kctl apply --server-side --field-manager=berth-e2e --force-conflicts -f - >/dev/null
	if ! kctl -n "$CONTROLLER_NS" rollout status deploy/snapshot-controller --timeout=120s >/dev/null; then
		kctl -n "$CONTROLLER_NS" describe pods -l app.kubernetes.io/name=snapshot-controller >&2 || true
		kctl -n "$CONTROLLER_NS" logs -l app.kubernetes.io/name=snapshot-controller --tail=30 >&2 || true
		die "snapshot-controller not available"
	fi
	log "VolumeSnapshot API: CRDs and snapshot-controller $SNAPSHOTTER_VERSION in $((SECONDS - t0))s"
}

# down deletes the Deployment so that no ReplicaSet brings back the pod that
# down.sh deletes; everything else goes with etcd.
down() {
	[ -x "$KUBECTL" ] && pid_of kube-apiserver >/dev/null || return 0
	kctl -n "$CONTROLLER_NS" delete deployment snapshot-controller --ignore-not-found --wait=false \
		--request-timeout=10s >/dev/null 2>&1 || true
}

case "${1:-}" in
up) up ;;
down) down ;;
*) die "usage: $0 up|down" ;;
esac
