#!/usr/bin/env bash
# Builds the pinned CSI sidecars (external-provisioner, external-resizer,
# csi-snapshotter) and the cluster's snapshot-controller (same module as
# csi-snapshotter) as static binaries from the Go module proxy into a cache
# keyed by version, so that a second run only checks that they exist.
#
#   hack/csi-sidecars.sh [name ...]   default: csi-provisioner csi-resizer csi-snapshotter
#                                     also: snapshot-controller
#
# Prints the cache folder on its last line. No registry is reachable here and
# `go install` fails on these modules (replace directives), so each module is
# downloaded, copied writable and built with -mod=mod.
set -euo pipefail

PROVISIONER_VERSION="${PROVISIONER_VERSION:-v5.3.0}"
RESIZER_VERSION="${RESIZER_VERSION:-v1.14.0}"
SNAPSHOTTER_VERSION="${SNAPSHOTTER_VERSION:-v8.3.0}"

names=("$@")
[ ${#names[@]} -gt 0 ] || names=(csi-provisioner csi-resizer csi-snapshotter)

log() { printf '[csi-sidecars] %s\n' "$*" >&2; }

# shellcheck source=lib/gobuild.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib/gobuild.sh"
OUT="$CACHE_ROOT/csi-sidecars"

# module NAME: prints "module version cmd-dir" of a sidecar.
module() {
	case "$1" in
	csi-provisioner) echo "github.com/kubernetes-csi/external-provisioner/v5 $PROVISIONER_VERSION cmd/csi-provisioner" ;;
	csi-resizer) echo "github.com/kubernetes-csi/external-resizer $RESIZER_VERSION cmd/csi-resizer" ;;
	csi-snapshotter) echo "github.com/kubernetes-csi/external-snapshotter/v8 $SNAPSHOTTER_VERSION cmd/csi-snapshotter" ;;
	snapshot-controller) echo "github.com/kubernetes-csi/external-snapshotter/v8 $SNAPSHOTTER_VERSION cmd/snapshot-controller" ;;
	*) log "unknown sidecar: $1"; exit 2 ;;
	esac
}

# drop_local_replaces: replaces into the module's own folders
# (external-snapshotter's ./client) are not in the downloaded module, so
# the required version is used.
drop_local_replaces() {
	local r
	for r in $(sed -n 's#^[[:space:]]*\(replace[[:space:]]\+\)\?\([^[:space:]]\+\)\( v[^[:space:]]*\)\? => \./.*#\2#p' go.mod); do
		go mod edit -dropreplace="$r"
	done
}

mkdir -p "$OUT"
for n in "${names[@]}"; do
	read -r mod version cmd < <(module "$n")
	build_module_command "$n" "$mod" "$version" "./$cmd" "$OUT/$n-$version" "-X main.version=$version" drop_local_replaces
done
echo "$OUT"
