#!/usr/bin/env bash
# Builds the e2e cluster's multus CNI plugins as static binaries from the Go
# module proxy into a cache keyed by version, so that a second run only
# checks that they exist:
#   multus       the thin plugin (gopkg.in/k8snetworkplumbingwg/multus-cni.v4,
#                cmd/multus): a CNI binary that reads a pod's networks
#                annotation through a kubeconfig and calls the delegates
#   whereabouts  the cluster-wide IPAM (github.com/k8snetworkplumbingwg/whereabouts,
#                cmd): allocations live in its IPPool objects
#
#   hack/cni-plugins.sh [name ...]   default: multus whereabouts
#   hack/cni-plugins.sh --module NAME   prints "module@version" of NAME
#                                       (where its CRDs are read from)
#
# Prints the cache folder on its last line (binaries NAME-VERSION). macvlan
# and the other reference plugins come from Debian (containernetworking-plugins).
# Each is built from a writable copy of the downloaded module with its own
# go.mod and go.sum (the dependency versions it was released with); the
# module zip keeps only vendor/modules.txt, so the vendor folder goes.
set -euo pipefail

MULTUS_VERSION="${MULTUS_VERSION:-v4.2.2}"
WHEREABOUTS_VERSION="${WHEREABOUTS_VERSION:-v0.8.0}"

log() { printf '[cni-plugins] %s\n' "$*" >&2; }

# shellcheck source=lib/gobuild.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib/gobuild.sh"
OUT="$CACHE_ROOT/cni-plugins"

# module NAME: prints "module version cmd-dir ldflags" of a plugin.
module() {
	case "$1" in
	multus) echo "gopkg.in/k8snetworkplumbingwg/multus-cni.v4 $MULTUS_VERSION ./cmd/multus -X=gopkg.in/k8snetworkplumbingwg/multus-cni.v4/pkg/multus.version=$MULTUS_VERSION" ;;
	whereabouts) echo "github.com/k8snetworkplumbingwg/whereabouts $WHEREABOUTS_VERSION ./cmd -X=github.com/k8snetworkplumbingwg/whereabouts/pkg/version.Version=$WHEREABOUTS_VERSION" ;;
	*) log "unknown plugin: $1"; exit 2 ;;
	esac
}

if [ "${1:-}" = --module ]; then
	read -r mod version _ < <(module "$2")
	echo "$mod@$version"
	exit 0
fi

names=("$@")
[ ${#names[@]} -gt 0 ] || names=(multus whereabouts)

# drop_vendor: the module zip keeps only vendor/modules.txt.
drop_vendor() { rm -rf vendor; }

# align_keep NAME: the modules a plugin keeps at its own versions
# (align_with_berth): multus v4.2.2 reads podresources' CDIDevices, which
# k8s.io/kubelet v0.34 renamed CdiDevices.
align_keep() {
	case "$1" in
	multus) echo '^k8s\.io/kubelet$' ;;
	esac
}

mkdir -p "$OUT"
for n in "${names[@]}"; do
	read -r mod version cmd ldflags < <(module "$n")
	ALIGN_KEEP=$(align_keep "$n") build_module_command "$n" "$mod" "$version" "$cmd" "$OUT/$n-$version" "-s -w $ldflags" drop_vendor
done
echo "$OUT"
