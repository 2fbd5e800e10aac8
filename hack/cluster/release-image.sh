#!/usr/bin/env bash
# Builds berth as an earlier commit made it (a previous release), once, into
# berth's cache keyed by commit, for the e2e upgrade scenario
# (test/e2e/upgrade_test.go):
#
#   hack/cluster/release-image.sh [--import] [COMMIT]
#
# COMMIT defaults to the previous release, PREVIOUS_RELEASE below: main's
# last commit before the upgrade scenario, the first whose keeper hands
# its connections over to a new one (9b4e295..0594b79). A fresh clone
# without tags has it: the tree comes from git, not from a tag.
# The commit's tree (git archive: a fresh clone without tags has it) is
# built with its own Makefile (`make build`) and its own image builder
# (hack/images, as `make image` runs it), into
# ~/.cache/berth/release/<full commit>/:
#
#   src/             the tree; its chart is src/deploy/berth, its CRDs src/deploy/berth/crds
#   src/bin/         berth, berth-blockdev, berth-flexvolume
#   berth.tar        the image, tagged berth.local/berth:<short commit> (also in the file tag)
#
# A second run only checks that berth.tar is there. --import also imports
# the image into every node of the running e2e cluster (as berth-image.sh
# does the dev image). The last line printed is the tarball's path.
# hack/prebuild.sh builds it in CI, beside the Go tests.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
# shellcheck source=lib.sh
. "$HERE/lib.sh"
# shellcheck source=../lib/gobuild.sh
. "$REPO/hack/lib/gobuild.sh"

PREVIOUS_RELEASE=ce85f7c

import=
if [ "${1:-}" = --import ]; then import=1 && shift; fi
[ $# -le 1 ] || die "usage: $0 [--import] [COMMIT]"
want=${1:-$PREVIOUS_RELEASE}
commit=$(git -C "$REPO" rev-parse --verify --quiet "$want^{commit}") ||
	die "$want is not a commit of $REPO (a shallow clone lacks the history: fetch it)"
short=$(git -C "$REPO" rev-parse --short=7 "$commit")
tag="berth.local/berth:$short"
out="$CACHE_ROOT/release/$commit"

[ -s "$out/berth.tar" ] || cache_lock "$out"
if [ -s "$out/berth.tar" ]; then
	log "cached: berth $short in $out"
else
	need_go
	mkdir -p "$CACHE_ROOT/release"
	tmp=$(mktemp -d "$CACHE_ROOT/release/.$short-XXXXXX")
	chmod 755 "$tmp"
	trap 'chmod -R u+w "$tmp" 2>/dev/null; rm -rf "$tmp"' EXIT
	mkdir "$tmp/src"
	git -C "$REPO" archive "$commit" | tar -x -C "$tmp/src"
	# No .git in the archive: the Makefile's `git describe` would say
	# "dev"; the version is the commit, as `git describe --always` says
	# without tags.
	log "building berth $short with its own Makefile (first time only, a few minutes)"
	# At today's module versions and tags where it builds so (hack/modalign:
	# the build cache then has its dependencies compiled already, ~3 minutes
	# of both cores less on a cold machine); its code is the release's.
	build_release() { (cd "$tmp/src" && ticking "building berth $short" make --no-print-directory build VERSION="$short" COMMIT="$short" "$@" >&2); }
	cp "$tmp/src/go.mod" "$tmp/go.mod.orig"
	cp "$tmp/src/go.sum" "$tmp/go.sum.orig"
	if [ "${BERTH_ALIGN:-1}" = 0 ] ||
		! (cd "$tmp/src" && align_with_berth && GOFLAGS=-mod=mod go mod tidy) ||
		! build_release GO_BUILD="CGO_ENABLED=1 go build -tags ceph,pacific,netgo,osusergo"; then
		[ "${BERTH_ALIGN:-1}" = 0 ] || log "berth $short does not build at today's module versions: building it at its own"
		cp "$tmp/go.mod.orig" "$tmp/src/go.mod"
		cp "$tmp/go.sum.orig" "$tmp/src/go.sum"
		build_release
	fi
	log "writing the image $tag with its own image builder"
	# The image carries the node's mkfs/resize tools and ganesha, as the
	# dev image does (images.sh).
	"$REPO/hack/install-deps.sh" e2fsprogs xfsprogs nfs-ganesha nfs-ganesha-vfs >&2
	mkdir "$tmp/img"
	(cd "$tmp/src" && CGO_ENABLED=0 go run -trimpath ./hack/images -out "$tmp/img" -pause "" -busybox "" -berth "$tmp/src/bin/berth" -berth-tag "$tag" >&2)
	mv "$tmp/img/berth.tar" "$tmp/berth.tar"
	rmdir "$tmp/img"
	echo "$tag" >"$tmp/tag"
	rm -rf "$out"
	mv "$tmp" "$out"
	trap - EXIT
	log "berth $short built into $out"
fi

if [ -n "$import" ]; then
	# shellcheck source=../vm/vm.sh
	. "$REPO/hack/vm/vm.sh"
	for i in $(node_indexes); do
		sock=$(node_sock "$i")
		ctr_() { ctr -a "$sock" -n k8s.io "$@"; }
		if node_is_vm "$i"; then ctr_() { vm_ctr "$i" "$@"; }; fi
		ctr_ version >/dev/null 2>&1 || die "containerd of $(node_name "$i") is not running (hack/cluster/up.sh)"
		if ctr_ images ls -q | grep -qxF "$tag"; then
			continue
		fi
		log "importing $tag into $(node_name "$i")"
		ctr_ images import --platform linux/amd64 "$out/berth.tar" >/dev/null
	done
fi
echo "$out/berth.tar"
