#!/usr/bin/env bash
# Builds the berth image from a berth binary (with its shared libraries) and imports it into
# every node of the running e2e cluster (tag berth.local/berth:dev), for a
# quick rebuild loop:
#
#   make build && hack/cluster/berth-image.sh bin/berth
#
# Pods with imagePullPolicy: Never pick the new image at their next start.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
# shellcheck source=lib.sh
. "$HERE/lib.sh"
. "$HERE/images.sh"
# shellcheck source=../vm/vm.sh
. "$REPO/hack/vm/vm.sh"

[ $# -eq 1 ] || die "usage: $0 BERTH_BINARY"
[ "$(id -u)" -eq 0 ] || die "run as root"
BERTH_E2E_BERTH_BINARY=$(readlink -f "$1")
for i in $(node_indexes); do
	sock=$(node_sock "$i")
	ctr_() { ctr -a "$sock" -n k8s.io "$@"; }
	# A VM node's containerd answers through its command channel.
	if node_is_vm "$i"; then ctr_() { vm_ctr "$i" "$@"; }; fi
	ctr_ version >/dev/null 2>&1 || die "containerd of $(node_name "$i") is not running (hack/cluster/up.sh)"
	IMPORT_NODE=$(node_name "$i") build_and_import_images
done
log "berth image $BERTH_IMAGE_TAG ready"
sed -i "s|^BERTH_IMAGE=.*|BERTH_IMAGE=$BERTH_IMAGE_TAG|" "$WORKDIR/cluster.env"
