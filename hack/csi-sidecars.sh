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
CACHE_ROOT="${BERTH_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/berth}"
OUT="$CACHE_ROOT/csi-sidecars"

names=("$@")
[ ${#names[@]} -gt 0 ] || names=(csi-provisioner csi-resizer csi-snapshotter)

log() { printf '[csi-sidecars] %s\n' "$*" >&2; }

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

mkdir -p "$OUT"
work=
trap 'if [ -n "$work" ]; then chmod -R u+w "$work" 2>/dev/null; rm -rf "$work"; fi' EXIT
for n in "${names[@]}"; do
	read -r mod version cmd < <(module "$n")
	bin="$OUT/$n-$version"
	if [ -x "$bin" ]; then
		log "cached: $bin"
		continue
	fi
	command -v go >/dev/null || { log "go is required (expected at /usr/local/go/bin)"; exit 1; }
	[ -n "$work" ] || work=$(mktemp -d)
	log "building $n $version from $mod (first time only, a few minutes)"
	dir=$(cd "$work" && GOFLAGS=-mod=mod go mod download -json "$mod@$version" | sed -n 's/.*"Dir": "\(.*\)".*/\1/p')
	[ -n "$dir" ] || { log "could not download $mod@$version"; exit 1; }
	cp -r "$dir" "$work/$n"
	chmod -R u+w "$work/$n"
	# Replaces into the module's own folders (external-snapshotter's
	# ./client) are not in the downloaded module: use the required version.
	for r in $(sed -n 's#^[[:space:]]*\(replace[[:space:]]\+\)\?\([^[:space:]]\+\)\( v[^[:space:]]*\)\? => \./.*#\2#p' "$work/$n/go.mod"); do
		(cd "$work/$n" && go mod edit -dropreplace="$r")
	done
	(cd "$work/$n" && CGO_ENABLED=0 GOFLAGS=-mod=mod go build -trimpath -ldflags "-X main.version=$version" -o "$bin.tmp" "./$cmd")
	mv "$bin.tmp" "$bin"
done
echo "$OUT"
