#!/usr/bin/env bash
# Builds the berth image from a static berth binary and imports it into the
# running e2e cluster (tag berth.local/berth:dev), for a quick rebuild loop:
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

[ $# -eq 1 ] || die "usage: $0 BERTH_BINARY"
[ "$(id -u)" -eq 0 ] || die "run as root"
BERTH_E2E_BERTH_BINARY=$(readlink -f "$1")
ctr -a "$CONTAINERD_SOCK" version >/dev/null 2>&1 || die "containerd of the e2e cluster is not running (hack/cluster/up.sh)"
ctr_() { ctr -a "$CONTAINERD_SOCK" -n k8s.io "$@"; }
build_and_import_images
log "berth image $BERTH_IMAGE_TAG ready"
sed -i "s|^BERTH_IMAGE=.*|BERTH_IMAGE=$BERTH_IMAGE_TAG|" "$WORKDIR/cluster.env"
