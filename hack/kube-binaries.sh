#!/usr/bin/env bash
# Builds pinned Kubernetes binaries (and etcd) from the Go module proxy into a
# cache keyed by version, so that a second run only checks that they exist.
#
#   hack/kube-binaries.sh [component ...]     default: etcd kube-apiserver
#
# Components: etcd kube-apiserver kube-controller-manager kube-scheduler kubelet kubectl
# Prints the cache folder on its last line (usable as KUBEBUILDER_ASSETS).
#
# No registry or release download is reachable on our machines, so the
# binaries are built from source: a throwaway module requires
# k8s.io/kubernetes and maps its staging modules to the same version.
set -euo pipefail

KUBE_VERSION="${KUBE_VERSION:-v1.34.4}"
ETCD_VERSION="${ETCD_VERSION:-v3.6.5}"
CACHE_ROOT="${BERTH_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/berth}"
OUT="$CACHE_ROOT/kube-$KUBE_VERSION-etcd-$ETCD_VERSION"

components=("$@")
[ ${#components[@]} -gt 0 ] || components=(etcd kube-apiserver)

log() { printf '[kube-binaries] %s\n' "$*" >&2; }

mkdir -p "$OUT"
missing=()
for c in "${components[@]}"; do
	case "$c" in
	etcd | kube-apiserver | kube-controller-manager | kube-scheduler | kubelet | kubectl) ;;
	*) log "unknown component: $c"; exit 2 ;;
	esac
	[ -x "$OUT/$c" ] || missing+=("$c")
done
if [ ${#missing[@]} -eq 0 ]; then
	log "cached: ${components[*]} in $OUT"
	echo "$OUT"
	exit 0
fi

command -v go >/dev/null || { log "go is required (expected at /usr/local/go/bin)"; exit 1; }

work=$(mktemp -d)
trap 'chmod -R u+w "$work" 2>/dev/null; rm -rf "$work"' EXIT

build_etcd() {
	log "building etcd $ETCD_VERSION (first time only)"
	mkdir -p "$work/etcd"
	cat >"$work/etcd/main.go" <<'EOF'
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
EOF
	(
		cd "$work/etcd"
		go mod init berth.local/etcd >/dev/null 2>&1
		go get "go.etcd.io/etcd/server/v3@$ETCD_VERSION" >/dev/null 2>&1 || go get "go.etcd.io/etcd/server/v3@$ETCD_VERSION"
		go mod tidy >/dev/null 2>&1 || go mod tidy
		CGO_ENABLED=0 go build -trimpath -o "$OUT/etcd.tmp" .
	)
	mv "$OUT/etcd.tmp" "$OUT/etcd"
}

kube_module() {
	# One module for every Kubernetes component: the staging replaces are shared.
	[ -f "$work/kube/go.mod" ] && return 0
	mkdir -p "$work/kube"
	local modfile staging
	modfile=$(cd "$work" && GOFLAGS=-mod=mod go mod download -json "k8s.io/kubernetes@$KUBE_VERSION" | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')
	[ -n "$modfile" ] || { log "could not download k8s.io/kubernetes@$KUBE_VERSION"; exit 1; }
	staging=$(sed -n 's#^[[:space:]]*\(k8s.io/[a-z0-9-]*\) => ./staging/.*#\1#p' "$modfile" | sort -u)
	local minor="v0.${KUBE_VERSION#v1.}"
	{
		echo "module berth.local/kube"
		echo
		echo "go 1.24"
		echo
		echo "require k8s.io/kubernetes $KUBE_VERSION"
		echo
		for m in $staging; do echo "replace $m => $m $minor"; done
	} >"$work/kube/go.mod"
}

kube_main() {
	local name=$1 pkg=$2 call=$3
	mkdir -p "$work/kube/cmd/$name"
	cat >"$work/kube/cmd/$name/main.go" <<EOF
package main

import (
	"os"

	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/logs/json/register"
	_ "k8s.io/component-base/metrics/prometheus/clientgo"
	_ "k8s.io/component-base/metrics/prometheus/version"
	app "$pkg"
)

func main() { os.Exit(cli.Run($call)) }
EOF
}

build_kube() {
	local c=$1
	kube_module
	case "$c" in
	kube-apiserver) kube_main "$c" k8s.io/kubernetes/cmd/kube-apiserver/app "app.NewAPIServerCommand()" ;;
	kube-controller-manager) kube_main "$c" k8s.io/kubernetes/cmd/kube-controller-manager/app "app.NewControllerManagerCommand()" ;;
	kube-scheduler) kube_main "$c" k8s.io/kubernetes/cmd/kube-scheduler/app "app.NewSchedulerCommand()" ;;
	kubelet) kube_main "$c" k8s.io/kubernetes/cmd/kubelet/app "app.NewKubeletCommand(context.Background())"
		sed -i 's#^import (#import (\n\t"context"#' "$work/kube/cmd/$c/main.go" ;;
	kubectl)
		mkdir -p "$work/kube/cmd/kubectl"
		cat >"$work/kube/cmd/kubectl/main.go" <<'EOF'
package main

import (
	"k8s.io/component-base/cli"
	"k8s.io/kubectl/pkg/cmd"
	"k8s.io/kubectl/pkg/cmd/util"
)

func main() {
	command := cmd.NewDefaultKubectlCommand()
	if err := cli.RunNoErrOutput(command); err != nil {
		util.CheckErr(err)
	}
}
EOF
		;;
	esac
	log "building $c $KUBE_VERSION (first time only; a few minutes on 2 cores)"
	local minor=${KUBE_VERSION#v1.}
	minor=${minor%%.*}
	(
		cd "$work/kube"
		GOFLAGS=-mod=mod go mod tidy >/dev/null 2>&1 || GOFLAGS=-mod=mod go mod tidy
		CGO_ENABLED=0 GOFLAGS=-mod=mod go build -trimpath \
			-ldflags "-s -w -X k8s.io/component-base/version.gitVersion=$KUBE_VERSION -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$minor -X k8s.io/component-base/version.gitTreeState=clean" \
			-o "$OUT/$c.tmp" "./cmd/$c"
	)
	mv "$OUT/$c.tmp" "$OUT/$c"
}

for c in "${missing[@]}"; do
	start=$SECONDS
	if [ "$c" = etcd ]; then build_etcd; else build_kube "$c"; fi
	log "$c ready in $((SECONDS - start))s"
done
echo "$OUT"
