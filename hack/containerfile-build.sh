#!/usr/bin/env bash
# Builds berth's image from the Containerfile with buildah, without a
# network, and checks it against the image `make image` writes:
#
#   hack/containerfile-build.sh     (root)
#
# 1. It installs buildah from Debian when it is missing.
# 2. It makes the two base images the Containerfile's build args point at,
#    so that no registry is needed:
#      localhost/berth-base-debian:bookworm-<key>  a Debian 12 root from
#          mmdebstrap with the final stage's packages
#      localhost/berth-base-go:bookworm-<key>      a Debian 12 root with the
#          build stage's packages, plus this machine's /usr/local/go
#    The packages are already there, so the Containerfile's apt steps install
#    nothing and the build needs no Debian mirror. The roots are cached in
#    ~/.cache/berth/containerfile/<key>/. The key is a hash of the part of
#    this script that makes them, the Containerfile's package lists, their
#    candidate versions here (apt-cache policy) and the Go version.
# 3. buildah bud --network=none. Go modules come from this machine's module
#    cache, read-only, as a file:// GOPROXY.
# 4. make image (into a scratch bin/), then: every path of its archive is in
#    the built image (its links resolved there, as in a container), the
#    entrypoint is the same, and `berth version` says the same in both.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=lib/gobuild.sh
. "$REPO/hack/lib/gobuild.sh"
CACHE="$CACHE_ROOT/containerfile"
MIRROR="${BERTH_CONTAINERFILE_MIRROR:-http://deb.debian.org/debian}"
SECURITY_MIRROR="${BERTH_CONTAINERFILE_SECURITY_MIRROR:-http://deb.debian.org/debian-security}"
KEYRING=/usr/share/keyrings/debian-archive-keyring.gpg
SUITE=bookworm
TAG=berth.local/berth:dev
export PATH="/usr/local/go/bin:/usr/local/sbin:/usr/sbin:/sbin:$PATH"

log() { printf '[containerfile %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() {
	log "error: $*"
	exit 1
}

[ "$(id -u)" -eq 0 ] || die "run as root (mmdebstrap --mode=root, buildah's storage)"
t0=$SECONDS
# buildah runs RUN steps with runc (a Recommends of buildah).
"$REPO/hack/install-deps.sh" buildah runc mmdebstrap
need_go

# packages STAGE: the packages the Containerfile's stage (1: build, 2: the
# image) installs through hack/install-deps.sh, its sets (--ceph-build)
# expanded, one a line.
packages() {
	local group
	sed -e ':a' -e '/\\$/{N;s/\\\n/ /;ba}' "$REPO/Containerfile" | awk -v want="$1" '
		/^FROM / {stage++; next}
		stage != want {next}
		{
			on = 0; group = ""
			for (i = 1; i <= NF; i++) {
				if ($i ~ /install-deps\.sh$/ && $i !~ /^--/) { if (group != "") print group; on = 1; group = ""; continue }
				if ($i == "&&" || $i == ";" || $i == "||") { if (group != "") print group; on = 0; group = ""; continue }
				if (on) group = group " " $i
			}
			if (group != "") print group
		}' | while read -r group; do
		# shellcheck disable=SC2086
		BERTH_DEPS_LIST=1 "$REPO/hack/install-deps.sh" $group
	done
}
build_pkgs=$(packages 1 | sort -u | tr '\n' ' ')
image_pkgs=$(packages 2 | sort -u | tr '\n' ' ')
[ -n "$build_pkgs" ] && [ -n "$image_pkgs" ] || die "no package lists in the Containerfile"

# shellcheck disable=SC2086
versions=$(apt-cache policy $build_pkgs $image_pkgs | awk '/^[^ ].*:$/ {p = $1} /^  Candidate:/ {print p $2}')
goversion=$(go version)
recipe=$(sed -n '/^rootfs() {/,/^log "bases ready/p' "${BASH_SOURCE[0]}")
key=$(echo "$recipe|$build_pkgs|$image_pkgs|$versions|$goversion" | sha256sum | cut -c1-12)
base_debian=localhost/berth-base-debian:$SUITE-$key
base_go=localhost/berth-base-go:$SUITE-$key
dir="$CACHE/$key"
mkdir -p "$dir"
# Older keys' roots and bases go.
find "$CACHE" -mindepth 1 -maxdepth 1 -type d ! -name "$key" -exec rm -rf {} +
buildah images --format '{{.Name}}:{{.Tag}}' | grep -E '^localhost/berth-base-(debian|go):' | grep -v -- "-$key\$" |
	grep -v ":$SUITE\$" | xargs -r buildah rmi >/dev/null 2>&1 || true

# rootfs NAME PACKAGES: $dir/NAME.tar, a Debian root with PACKAGES (cached).
rootfs() {
	local out="$dir/$1.tar" s=$SECONDS incl
	[ -s "$out" ] && return 0
	incl=$(echo "$2" | tr ' ' ',' | sed 's/,$//')
	log "mmdebstrap $SUITE $1: $2"
	nice timeout 1800 mmdebstrap --quiet --mode=root --variant=minbase --format=tar --include="$incl" \
		--aptopt='Acquire::Retries "3"' --skip=output/dev \
		--customize-hook='rm -f "$1"/etc/hostname "$1"/etc/resolv.conf' \
		"$SUITE" "$out.tmp" \
		"deb [signed-by=$KEYRING] $MIRROR $SUITE main" \
		"deb [signed-by=$KEYRING] $MIRROR $SUITE-updates main" \
		"deb [signed-by=$KEYRING] $SECURITY_MIRROR $SUITE-security main" || die "mmdebstrap failed"
	mv "$out.tmp" "$out"
	log "  $1 root in $((SECONDS - s))s ($(du -h "$out" | cut -f1))"
}

# base IMAGE ROOT DIR [buildah config args...]: IMAGE from the root tarball
# and this machine's folder DIR ("-": none), unless it exists.
base() {
	local image=$1 root=$2 extra=$3 ctr
	shift 3
	buildah inspect --type image "$image" >/dev/null 2>&1 && return 0
	log "base image $image"
	ctr=$(buildah from scratch)
	buildah add --quiet "$ctr" "$root" / >/dev/null
	[ "$extra" = - ] || buildah copy --quiet "$ctr" "$extra" "$extra" >/dev/null
	buildah config "$@" "$ctr"
	buildah commit --quiet --rm "$ctr" "$image" >/dev/null
	buildah tag "$image" "${image%-"$key"}"
}

rootfs debian "$image_pkgs"
rootfs go "$build_pkgs"
envpath=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
base "$base_debian" "$dir/debian.tar" - --env "PATH=$envpath" --cmd /bin/bash
# As the golang image: Go in /usr/local/go, GOPATH /go, no toolchain switch.
base "$base_go" "$dir/go.tar" /usr/local/go --env "PATH=/go/bin:/usr/local/go/bin:$envpath" \
	--env GOPATH=/go --env GOTOOLCHAIN=local --workingdir /go --cmd /bin/bash
log "bases ready at $((SECONDS - t0))s: $base_debian $base_go"

work=$(mktemp -d /var/tmp/berth-containerfile.XXXXXX)
ctr=
cleanup() {
	[ -z "$ctr" ] || buildah rm "$ctr" >/dev/null 2>&1 || true
	rm -rf "$work"
}
trap cleanup EXIT

# The version both builds stamp, computed as the Makefile does.
version=$(git -C "$REPO" describe --tags --always --dirty 2>/dev/null || echo dev)
commit=$(git -C "$REPO" rev-parse --short HEAD 2>/dev/null || echo unknown)
s=$SECONDS
log "buildah bud --network=none (berth $version $commit)"
buildah bud --network=none --layers --pull=never -f "$REPO/Containerfile" -t "$TAG" \
	--build-arg GO_IMAGE="$base_go" --build-arg BASE_IMAGE="$base_debian" \
	--build-arg VERSION="$version" --build-arg COMMIT="$commit" \
	--build-arg GOPROXY=file:///gomodcache \
	-v "$(go env GOMODCACHE)/cache/download:/gomodcache:ro" \
	"$REPO" >"$work/bud.log" 2>&1 || {
	tail -n 40 "$work/bud.log" >&2
	die "buildah bud failed"
}
log "  built $TAG in $((SECONDS - s))s"
# Earlier builds' images go; the Go caches (RUN --mount=type=cache) stay.
buildah rmi --prune >/dev/null 2>&1 || true

s=$SECONDS
log "make image"
mkdir -p "$work/bin"
make -C "$REPO" --no-print-directory -s image BIN="$work/bin" VERSION="$version" COMMIT="$commit" >&2
mkdir -p "$work/archive" "$work/made"
tar -xf "$REPO/_output/berth-image.tar" -C "$work/archive"
manifest=$(cat "$work/archive/manifest.json")
layer=$(sed -n 's/.*"Layers":\["\([^"]*\)"\].*/\1/p' <<<"$manifest")
config=$(sed -n 's/.*"Config":"\([^"]*\)".*/\1/p' <<<"$manifest")
[ -n "$layer" ] && [ -n "$config" ] || die "make image's archive: no single layer in manifest.json"
tar -xzf "$work/archive/$layer" -C "$work/made"
log "  in $((SECONDS - s))s"

ctr=$(buildah from --pull=never "$TAG")
mnt=$(buildah mount "$ctr")
# Every entry of make image's layer, by type: a folder, a file (executable
# where it is there), a link (or what the link names).
fails=$(tar -tvzf "$work/archive/$layer" | awk '{t = substr($1, 1, 1); x = (substr($1, 4, 1) == "x") ? "x" : "-"; print t x " /" $6}' |
	chroot "$mnt" /bin/sh -c '
		while read -r t p; do
			p=${p%/}
			case $t in
			d?) [ -d "$p" ] ;;
			l?) [ -L "$p" ] || [ -e "$p" ] ;;
			-x) [ -f "$p" ] && [ -x "$p" ] ;;
			*) [ -f "$p" ] ;;
			esac || echo "  missing: $t $p"
		done')
n=$(tar -tzf "$work/archive/$layer" | wc -l)
[ -z "$fails" ] || die "the Containerfile's image lacks what make image's has:
$fails"
log "all $n paths of make image's image are in the Containerfile's"

# Both as Go prints a list: [/usr/local/bin/berth].
want=$(grep -o '"Entrypoint":\[[^]]*\]' "$work/archive/$config" | sed 's/^"Entrypoint"://; s/","/ /g; s/"//g')
got=$(buildah inspect --type image --format '{{.OCIv1.Config.Entrypoint}}' "$TAG")
[ "$want" = "$got" ] || die "entrypoint: make image $want, Containerfile $got"

made=$(chroot "$work/made" /usr/local/bin/berth version)
built=$(chroot "$mnt" /usr/local/bin/berth version)
[ "$made" = "$built" ] || die "berth version: make image's says $made, the Containerfile's $built"
log "berth version in both: $built"
log "ok in $((SECONDS - t0))s"
