#!/usr/bin/env bash
# Unpacks prometheus and promtool from Debian's prometheus package into a
# cache keyed by the package's version, for the test that loads the chart's
# alerts into a real Prometheus (deploy/ TestAlertsEvaluateInPrometheus).
#
#   hack/prometheus.sh        prints the folder of both binaries on its last line
#
# The package is downloaded and unpacked, not installed: installing would
# add a service that listens on every address, a user, and some forty
# MiB of web assets the test has no use for.
set -euo pipefail

CACHE_ROOT="${BERTH_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/berth}"
log() { printf '[prometheus] %s\n' "$*" >&2; }

version=$(apt-cache policy prometheus 2>/dev/null | sed -n 's/^ *Candidate: //p')
if [ -z "$version" ] || [ "$version" = "(none)" ]; then
	apt-get -o DPkg::Lock::Timeout=300 update -qq >/dev/null
	version=$(apt-cache policy prometheus 2>/dev/null | sed -n 's/^ *Candidate: //p')
fi
[ -n "$version" ] && [ "$version" != "(none)" ] || { log "no prometheus package in the apt sources"; exit 1; }
out="$CACHE_ROOT/prometheus-${version//[^A-Za-z0-9.+-]/_}"
if [ -x "$out/prometheus" ] && [ -x "$out/promtool" ]; then
	log "cached: $out"
	echo "$out"
	exit 0
fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
log "downloading Debian's prometheus $version (first time only)"
# As root into a folder of its own: no sandbox user needs to write there.
(cd "$tmp" && apt-get -o APT::Sandbox::User=root download -qq "prometheus=$version" >/dev/null)
dpkg-deb -x "$tmp"/prometheus_*.deb "$tmp/root"
mkdir -p "$(dirname "$out")"
rm -rf "$out.tmp"
mkdir "$out.tmp"
cp "$tmp/root/usr/bin/prometheus" "$tmp/root/usr/bin/promtool" "$out.tmp/"
rm -rf "$out"
mv "$out.tmp" "$out"
log "unpacked to $out"
echo "$out"
