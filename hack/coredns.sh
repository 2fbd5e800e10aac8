#!/usr/bin/env bash
# Builds a pinned CoreDNS as a static binary from the Go module proxy into a
# cache keyed by version, so that a second run only checks that it exists.
#
#   hack/coredns.sh           prints the binary's path on its last line
#
# No registry is reachable here, so the e2e cluster's DNS is built from
# source: a throwaway module whose main is CoreDNS's own (coremain.Run), with
# only the plugins the cluster's Corefile uses linked in. The plugin order
# comes from core/dnsserver's directive list, not from the imports, so a
# subset behaves as the full build does and skips the cloud SDKs (route53,
# azure, clouddns) that would triple the build.
set -euo pipefail

COREDNS_VERSION="${COREDNS_VERSION:-v1.12.4}"
# shellcheck source=lib/gobuild.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib/gobuild.sh"
OUT="$CACHE_ROOT/coredns"
BIN="$OUT/coredns-$COREDNS_VERSION"

log() { printf '[coredns] %s\n' "$*" >&2; }

if [ -x "$BIN" ]; then
	log "cached: $BIN"
	echo "$BIN"
	exit 0
fi
cache_lock "$BIN"
if [ -x "$BIN" ]; then
	log "built meanwhile: $BIN"
	echo "$BIN"
	exit 0
fi
need_go
mkdir -p "$OUT"
scratch

log "building CoreDNS $COREDNS_VERSION (first time only, a few minutes)"
start=$SECONDS
cat >"$work/main.go" <<'EOF'
// Command coredns is CoreDNS's main with the plugins of the e2e cluster's
// Corefile (hack/cluster/dns.sh).
package main

import (
	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/loadbalance"
	_ "github.com/coredns/coredns/plugin/log"
	_ "github.com/coredns/coredns/plugin/metrics"
	_ "github.com/coredns/coredns/plugin/ready"
	_ "github.com/coredns/coredns/plugin/reload"

	"github.com/coredns/coredns/coremain"
)

func main() { coremain.Run() }
EOF
(
	cd "$work"
	go mod init berth.local/coredns >/dev/null 2>&1
	go get "github.com/coredns/coredns@$COREDNS_VERSION" >/dev/null 2>&1 || go get "github.com/coredns/coredns@$COREDNS_VERSION"
	go mod tidy >/dev/null 2>&1 || go mod tidy
	align_with_berth
	# The version CoreDNS reports is its module's; GitCommit names the pin.
	CGO_ENABLED=0 GOFLAGS=-mod=mod go build -trimpath -ldflags "-s -w -X github.com/coredns/coredns/coremain.GitCommit=$COREDNS_VERSION" -o "$BIN.tmp" .
)
mv "$BIN.tmp" "$BIN"
log "CoreDNS $COREDNS_VERSION ready in $((SECONDS - start))s"
echo "$BIN"
