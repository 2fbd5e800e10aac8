#!/usr/bin/env bash
# Runs the standalone csi-sanity binary (built from the pinned csi-test
# module) against `berth agent` and `berth csi-controller` started as
# separate processes on a real kube-apiserver + etcd, once with mount and
# once with block access, on a local class and (unless BERTH_CEPH=0) on a
# ceph class on its own test Ceph (hack/ceph). Needs root (loop devices,
# mkfs, mounts).
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="/usr/local/go/bin:$PATH"
[ "$(id -u)" -eq 0 ] || { echo "sanity.sh: needs root (loop devices, mounts)" >&2; exit 1; }

hack/install-deps.sh
KUBEBUILDER_ASSETS=$(hack/kube-binaries.sh | tail -n 1)
export KUBEBUILDER_ASSETS
make --no-print-directory build >/dev/null
CGO_ENABLED=0 go build -trimpath -o bin/csi-sanity github.com/kubernetes-csi/csi-test/v5/cmd/csi-sanity
CGO_ENABLED=0 go build -trimpath -o bin/apiserver ./test/apiserver

work=$(mktemp -d /tmp/berth-sanity.XXXXXX)
pids=()
ceph_up=
cleanup() {
	for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
	for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
	if [ -n "$ceph_up" ]; then hack/ceph/down.sh >/dev/null && hack/ceph/leftovers.sh || true; fi
	# Whatever a failed run left: unmount, detach, remove.
	grep -F "$work" /proc/self/mountinfo | awk '{print $5}' | sort -r | xargs -r -n1 umount -l 2>/dev/null || true
	losetup -a | grep -F "$work" | cut -d: -f1 | xargs -r -n1 losetup -d 2>/dev/null || true
	rm -rf "$work"
}
trap cleanup EXIT

# The ceph class's own test Ceph (folder and ports apart from the others).
ceph=()
if [ "${BERTH_CEPH:-1}" != 0 ]; then
	export BERTH_CEPH_DIR=/var/lib/berth-ceph-sanity-sh BERTH_CEPH_MON_PORT=3315 BERTH_CEPH_PORT_MIN=7400 BERTH_CEPH_PORT_MAX=7499
	ceph_up=1
	hack/ceph/up.sh >"$work/ceph-up.log" 2>&1 || { tail -n 20 "$work/ceph-up.log" >&2; exit 1; }
	env_file=$(tail -n 1 "$work/ceph-up.log")
	ceph=(--ceph-storage-cluster sanity-ceph --ceph-env "$env_file")
	# The cephx key reaches the node as NodeStageVolume secrets (0600 file).
	# The nodes' client (`profile rbd` alone), as kubelet would pass it.
	client=$(sed -n 's/^BERTH_CEPH_NODE_CLIENT=//p' "$env_file")
	key=$(sed -n 's/^[[:space:]]*key[[:space:]]*=[[:space:]]*//p' "$(sed -n 's/^BERTH_CEPH_NODE_KEYRING=//p' "$env_file")")
	(umask 077 && printf 'NodeStageVolumeSecret:\n  userID: "%s"\n  userKey: "%s"\n' "$client" "$key" >"$work/ceph-secrets.yaml")
fi
bin/apiserver --write-kubeconfig "$work/kubeconfig" --node sanity-node --storage-cluster sanity --storage-cluster-data-dir "$work/data" --storage-class berth "${ceph[@]}" >"$work/apiserver.log" 2>&1 &
pids+=($!)
# Ready once its objects (node, StorageCluster) are made, after the kubeconfig.
for _ in $(seq 1 120); do grep -q '^apiserver: ready' "$work/apiserver.log" && break; sleep 0.5; done
grep -q '^apiserver: ready' "$work/apiserver.log" || { cat "$work/apiserver.log" >&2; exit 1; }

# The keeper of userspace volumes (the ceph class's mounter).
mkdir -p "$work/run"
bin/berth keeper --socket "$work/run/keeper.sock" >"$work/keeper.log" 2>&1 &
pids+=($!)
bin/berth agent --kubeconfig "$work/kubeconfig" --keeper-socket "$work/run/keeper.sock" --node-name sanity-node --data-dir "$work/data" --run-dir "$work/run" \
	--csi-endpoint "unix://$work/node.sock" --kubelet-dir "$work/kubelet" --volume-plugin-dir "" \
	--agent-socket "$work/run/agent.sock" --capacity-interval 1s --metrics-addr 0 --health-addr 0 >"$work/agent.log" 2>&1 &
pids+=($!)
bin/berth csi-controller --kubeconfig "$work/kubeconfig" --endpoint "unix://$work/controller.sock" \
	--metrics-addr 0 --health-addr 0 >"$work/controller.log" 2>&1 &
pids+=($!)
for _ in $(seq 1 120); do [ -S "$work/node.sock" ] && [ -S "$work/controller.sock" ] && break; sleep 0.5; done

# The class parameters every volume gets: the cluster it belongs to (and
# for ceph the userspace mounter: this kernel has no krbd).
printf 'storageCluster: sanity\n' >"$work/local.yaml"
printf 'storageCluster: sanity-ceph\nmounter: userspace\n' >"$work/ceph.yaml"
rc=0
# sanity NAME ACCESS CLASS [csi-sanity flags]: one csi-sanity run.
sanity() {
	local name=$1 access=$2 class=$3
	shift 3
	mkdir -p "$work/kubelet/pods/sanity-$name/volumes/kubernetes.io~csi/pv" "$work/kubelet/plugins/kubernetes.io/csi/berth.io/$name"
	bin/csi-sanity --csi.endpoint "$work/node.sock" --csi.controllerendpoint "$work/controller.sock" \
		--csi.mountdir "$work/kubelet/pods/sanity-$name/volumes/kubernetes.io~csi/pv/target" \
		--csi.stagingdir "$work/kubelet/plugins/kubernetes.io/csi/berth.io/$name/staging" \
		--csi.testvolumeaccesstype "$access" --csi.testvolumesize $((64 << 20)) \
		--csi.testvolumeexpandsize $((128 << 20)) --csi.testvolumeparameters "$work/$class.yaml" \
		--ginkgo.no-color "$@"
}
for access in mount block; do
	echo "== csi-sanity, $access access"
	sanity "$access" "$access" local 2>&1 | tail -n 25 || rc=1
done
if [ ${#ceph[@]} -gt 0 ]; then
	# The node's specs that stage a ceph volume run once the agent can: an
	# agent without the ceph transport looks for a local image file of the
	# volume and answers NotFound "image of volume ...: volume not found".
	stage_spec='Node Service NodeGetVolumeStats should fail when volume does not exist on the specified path$'
	node_skip=()
	if ! sanity ceph-probe mount ceph --csi.secrets "$work/ceph-secrets.yaml" --ginkgo.focus "$stage_spec" >"$work/ceph-probe.log" 2>&1; then
		if grep -q 'image of volume .*: volume not found' "$work/ceph-probe.log"; then
			echo "== the ceph class's node specs (stage, publish) are skipped: this agent cannot stage a ceph volume yet"
			node_skip=(--ginkgo.skip 'Node Service (NodeUnpublishVolume should remove target path|NodeGetVolumeStats should fail when volume does not exist on the specified path|NodeExpandVolume should work if node-expand is called after node-publish|should work|should be idempotent)$')
		else
			tail -n 40 "$work/ceph-probe.log"
			rc=1
		fi
	fi
	for access in mount block; do
		echo "== csi-sanity, ceph class, $access access"
		sanity "ceph-$access" "$access" ceph --csi.secrets "$work/ceph-secrets.yaml" "${node_skip[@]}" 2>&1 | tail -n 25 || rc=1
	done
else
	echo "== the ceph class is skipped: BERTH_CEPH=0"
fi
if [ $rc -ne 0 ]; then
	echo "== agent log (tail)"; tail -n 40 "$work/agent.log"
	echo "== controller log (tail)"; tail -n 40 "$work/controller.log"
fi
exit $rc
