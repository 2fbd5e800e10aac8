#!/usr/bin/env bash
# Builds pinned Kubernetes binaries (and etcd) from the Go module proxy into a
# cache keyed by version, so that a second run only checks that they exist.
#
#   hack/kube-binaries.sh [component ...]     default: etcd kube-apiserver
#
# Components: etcd kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy kubectl
#             e2e.test (the upstream e2e suite runner, with only the framework and the
#             External Storage suites compiled in; used by hack/conformance.sh)
#             agnhost (the e2e suite's test image program, test/images/agnhost)
#             ginkgo (the CLI that runs e2e.test in parallel; the version k8s.io/kubernetes requires)
# Prints the cache folder on its last line (usable as KUBEBUILDER_ASSETS).
#
# No registry or release download is reachable on our machines, so the
# binaries are built from source: a throwaway module requires
# k8s.io/kubernetes and maps its staging modules to the same version.
set -euo pipefail

KUBE_VERSION="${KUBE_VERSION:-v1.34.4}"
ETCD_VERSION="${ETCD_VERSION:-v3.6.5}"
# shellcheck source=lib/gobuild.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib/gobuild.sh"
OUT="$CACHE_ROOT/kube-$KUBE_VERSION-etcd-$ETCD_VERSION"

components=("$@")
[ ${#components[@]} -gt 0 ] || components=(etcd kube-apiserver)

log() { printf '[kube-binaries] %s\n' "$*" >&2; }

mkdir -p "$OUT"
missing=()
for c in "${components[@]}"; do
	case "$c" in
	etcd | kube-apiserver | kube-controller-manager | kube-scheduler | kubelet | kube-proxy | kubectl | e2e.test | agnhost | ginkgo) ;;
	*) log "unknown component: $c"; exit 2 ;;
	esac
	[ -x "$OUT/$c" ] || missing+=("$c")
done
if [ ${#missing[@]} -eq 0 ]; then
	log "cached: ${components[*]} in $OUT"
	echo "$OUT"
	exit 0
fi

need_go

scratch

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
		align_with_berth
		CGO_ENABLED=0 GOFLAGS=-mod=mod go build -trimpath -o "$OUT/etcd.tmp" .
	)
	mv "$OUT/etcd.tmp" "$OUT/etcd"
}

AGNHOST_PKG=k8s.io/kubernetes/test/images/agnhost
GINKGO_PKG=github.com/onsi/ginkgo/v2/ginkgo

staging_keep=
kube_module() {
	# One module for every Kubernetes component: the staging replaces are shared.
	[ -f "$work/kube/go.mod" ] && return 0
	mkdir -p "$work/kube"
	local modfile staging
	modfile=$(cd "$work" && GOFLAGS=-mod=mod go mod download -json "k8s.io/kubernetes@$KUBE_VERSION" | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')
	[ -n "$modfile" ] || { log "could not download k8s.io/kubernetes@$KUBE_VERSION"; exit 1; }
	staging=$(sed -n 's#^[[:space:]]*\(k8s.io/[a-z0-9-]*\) => ./staging/.*#\1#p' "$modfile" | sort -u)
	local minor="v0.${KUBE_VERSION#v1.}" shared
	# k8s.io/kubernetes requires its staging modules at v0.0.0: each is
	# replaced by its release, and the ones berth uses are also required at
	# that release. Required, not only replaced, they are built as the
	# very modules berth's build has (the build cache keys a package by its
	# module's path and version), and client-go compiles once (see
	# align_with_berth).
	shared=$(cd "$BERTH_ROOT" && go list -m -f '{{.Path}}' all | sort)
	{
		echo "module berth.local/kube"
		echo
		echo "go 1.24"
		echo
		echo "require k8s.io/kubernetes $KUBE_VERSION"
		echo
		for m in $staging; do
			echo "replace $m v0.0.0 => $m $minor"
			if [ "${BERTH_ALIGN:-1}" != 0 ] && grep -qx "$m" <<<"$shared"; then echo "require $m $minor"; fi
		done
	} >"$work/kube/go.mod"
	# The staging modules stay at this release, whatever berth uses.
	staging_keep="^($(tr '\n' '|' <<<"$staging" | sed 's/|$//; s/\./\\./g'))\$"
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

e2e_test_main() {
	# The upstream e2e.test compiles every suite of test/e2e; the storage
	# conformance run needs only the suite setup (package e2e) and the
	# External Storage driver loader, which defines its tests from the
	# -storage.testdriver flag.
	mkdir -p "$work/kube/cmd/e2e.test"
	cat >"$work/kube/cmd/e2e.test/e2e_test.go" <<'EOF'
package e2e

import (
	"flag"
	"fmt"
	"os"
	"testing"

	"k8s.io/component-base/version"
	"k8s.io/kubernetes/test/e2e"
	"k8s.io/kubernetes/test/e2e/framework"
	"k8s.io/kubernetes/test/e2e/framework/config"
	"k8s.io/kubernetes/test/e2e/framework/testfiles"
	e2etestingmanifests "k8s.io/kubernetes/test/e2e/testing-manifests"
	testfixtures "k8s.io/kubernetes/test/fixtures"

	_ "k8s.io/kubernetes/test/e2e/feature"
	_ "k8s.io/kubernetes/test/e2e/framework/debug/init"
	_ "k8s.io/kubernetes/test/e2e/framework/metrics/init"
	_ "k8s.io/kubernetes/test/e2e/framework/node/init"
	_ "k8s.io/kubernetes/test/e2e/storage/external"
	_ "k8s.io/kubernetes/test/utils/format"
)

func TestMain(m *testing.M) {
	showVersion := flag.CommandLine.Bool("version", false, "Displays version information.")
	config.CopyFlags(config.Flags, flag.CommandLine)
	framework.RegisterCommonFlags(flag.CommandLine)
	framework.RegisterClusterFlags(flag.CommandLine)
	flag.Parse()
	if *showVersion {
		fmt.Println(version.Get())
		os.Exit(0)
	}
	testfiles.AddFileSource(e2etestingmanifests.GetE2ETestingManifestsFS())
	testfiles.AddFileSource(testfixtures.GetTestFixturesFS())
	framework.AfterReadingAllFlags(&framework.TestContext)
	os.Exit(m.Run())
}

func TestE2E(t *testing.T) { e2e.RunE2ETests(t) }
EOF
}

build_kube() {
	local c=$1
	kube_module
	case "$c" in
	kube-apiserver) kube_main "$c" k8s.io/kubernetes/cmd/kube-apiserver/app "app.NewAPIServerCommand()" ;;
	kube-controller-manager) kube_main "$c" k8s.io/kubernetes/cmd/kube-controller-manager/app "app.NewControllerManagerCommand()" ;;
	kube-scheduler) kube_main "$c" k8s.io/kubernetes/cmd/kube-scheduler/app "app.NewSchedulerCommand()" ;;
	kube-proxy) kube_main "$c" k8s.io/kubernetes/cmd/kube-proxy/app "app.NewProxyCommand()" ;;
	kubelet) kube_main "$c" k8s.io/kubernetes/cmd/kubelet/app "app.NewKubeletCommand(context.Background())"
		sed -i 's#^import (#import (\n\t"context"#' "$work/kube/cmd/$c/main.go" ;;
	e2e.test) e2e_test_main ;;
	agnhost | ginkgo)
		# Main packages of the module graph, built by import path; this file
		# keeps their dependencies in the module through go mod tidy.
		mkdir -p "$work/kube/tools"
		printf '//go:build tools\n\npackage tools\n\nimport (\n\t_ "%s"\n\t_ "%s"\n)\n' \
			"$AGNHOST_PKG" "$GINKGO_PKG" >"$work/kube/tools/tools.go"
		;;
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
	local ldflags="-s -w -X k8s.io/component-base/version.gitVersion=$KUBE_VERSION -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$minor -X k8s.io/component-base/version.gitTreeState=clean"
	(
		cd "$work/kube"
		GOFLAGS=-mod=mod go mod tidy >/dev/null 2>&1 || GOFLAGS=-mod=mod go mod tidy
		align_with_berth "$staging_keep"
		if [ "$c" = agnhost ] || [ "$c" = ginkgo ]; then
			local pkg=$AGNHOST_PKG
			[ "$c" = agnhost ] || pkg=$GINKGO_PKG
			CGO_ENABLED=0 GOFLAGS=-mod=mod go build -trimpath -ldflags "$ldflags" -o "$OUT/$c.tmp" "$pkg"
		elif [ "$c" = e2e.test ]; then
			# A test binary: go test -c is the only way to link a _test package.
			CGO_ENABLED=0 GOFLAGS=-mod=mod go test -c -trimpath -ldflags "$ldflags" -o "$OUT/$c.tmp" "./cmd/$c"
		else
			CGO_ENABLED=0 GOFLAGS=-mod=mod go build -trimpath -ldflags "$ldflags" -o "$OUT/$c.tmp" "./cmd/$c"
		fi
	)
	mv "$OUT/$c.tmp" "$OUT/$c"
}

for c in "${missing[@]}"; do
	cache_lock "$OUT/$c"
	if [ -x "$OUT/$c" ]; then
		log "built meanwhile: $c"
		cache_unlock
		continue
	fi
	start=$SECONDS
	if [ "$c" = etcd ]; then build_etcd; else build_kube "$c"; fi
	cache_unlock
	log "$c ready in $((SECONDS - start))s"
done
echo "$OUT"
