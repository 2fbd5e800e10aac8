#!/usr/bin/env bash
# Runs the standalone csi-sanity binary (built from the pinned csi-test
# module) against `berth agent` and `berth csi-controller` started as
# separate processes on a real kube-apiserver + etcd, once with mount and
# once with block access. Needs root (loop devices, mkfs, mounts).
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="/usr/local/go/bin:$PATH"
[ "$(id -u)" -eq 0 ] || { echo "sanity.sh: needs root (loop devices, mounts)" >&2; exit 1; }

hack/install-deps.sh
KUBEBUILDER_ASSETS=$(hack/kube-binaries.sh | tail -n 1)
export KUBEBUILDER_ASSETS
make --no-print-directory build >/dev/null
go build -o bin/csi-sanity github.com/kubernetes-csi/csi-test/v5/cmd/csi-sanity
go build -o bin/apiserver ./test/apiserver

work=$(mktemp -d /tmp/berth-sanity.XXXXXX)
pids=()
cleanup() {
	for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
	for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
	# Whatever a failed run left: unmount, detach, remove.
	grep -F "$work" /proc/self/mountinfo | awk '{print $5}' | sort -r | xargs -r -n1 umount -l 2>/dev/null || true
	losetup -a | grep -F "$work" | cut -d: -f1 | xargs -r -n1 losetup -d 2>/dev/null || true
	rm -rf "$work"
}
trap cleanup EXIT

bin/apiserver --write-kubeconfig "$work/kubeconfig" --node sanity-node --storage-cluster sanity --storage-cluster-data-dir "$work/data" --storage-class berth >"$work/apiserver.log" 2>&1 &
pids+=($!)
# Ready once its objects (node, StorageCluster) are made, after the kubeconfig.
for _ in $(seq 1 120); do grep -q '^apiserver: ready' "$work/apiserver.log" && break; sleep 0.5; done
grep -q '^apiserver: ready' "$work/apiserver.log" || { cat "$work/apiserver.log" >&2; exit 1; }

bin/berth agent --kubeconfig "$work/kubeconfig" --node-name sanity-node --data-dir "$work/data" --run-dir "$work/run" \
	--csi-endpoint "unix://$work/node.sock" --kubelet-dir "$work/kubelet" --volume-plugin-dir "" \
	--agent-socket "$work/run/agent.sock" --capacity-interval 1s --metrics-addr 0 --health-addr 0 >"$work/agent.log" 2>&1 &
pids+=($!)
bin/berth csi-controller --kubeconfig "$work/kubeconfig" --endpoint "unix://$work/controller.sock" \
	--metrics-addr 0 --health-addr 0 >"$work/controller.log" 2>&1 &
pids+=($!)
for _ in $(seq 1 120); do [ -S "$work/node.sock" ] && [ -S "$work/controller.sock" ] && break; sleep 0.5; done

# The class parameters every volume gets: the cluster it belongs to.
printf 'storageCluster: sanity\n' >"$work/params.yaml"
rc=0
for access in mount block; do
	echo "== csi-sanity, $access access"
	mkdir -p "$work/kubelet/pods/sanity-$access/volumes/kubernetes.io~csi/pv" "$work/kubelet/plugins/kubernetes.io/csi/berth.io/$access"
	bin/csi-sanity --csi.endpoint "$work/node.sock" --csi.controllerendpoint "$work/controller.sock" \
		--csi.mountdir "$work/kubelet/pods/sanity-$access/volumes/kubernetes.io~csi/pv/target" \
		--csi.stagingdir "$work/kubelet/plugins/kubernetes.io/csi/berth.io/$access/staging" \
		--csi.testvolumeaccesstype "$access" --csi.testvolumesize $((64 << 20)) \
		--csi.testvolumeexpandsize $((128 << 20)) --csi.testvolumeparameters "$work/params.yaml" \
		--ginkgo.succinct --ginkgo.no-color 2>&1 | tail -n 25 || rc=1
done
if [ $rc -ne 0 ]; then
	echo "== agent log (tail)"; tail -n 40 "$work/agent.log"
	echo "== controller log (tail)"; tail -n 40 "$work/controller.log"
fi
exit $rc
