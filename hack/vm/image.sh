#!/usr/bin/env bash
# Builds what a VM test node boots, once per version, into
# ~/.cache/berth/vm/<kernel>-<key>/:
#
#   vmlinuz      Debian 13's stock kernel (linux-image-6.12.*-amd64, trixie):
#                nbd, krbd, the NFS client and ublk as modules, which the
#                machine's own kernel lacks
#   initrd.img   busybox and the few modules that reach the root disk and the
#                9p shares (virtio_blk, ext4, virtio_net, 9p)
#   rootfs.qcow2 an ext4 root from Debian's packages (bookworm userland, as
#                on the host): containerd, runc, the CNI plugins, iptables,
#                nfs-common, ceph-common, ... and the kernel's module tree
#                with its modules.dep (depmod)
#   versions.txt every package version in the image
#
#   hack/vm/image.sh          prints the cache folder on its last line
#
# The key is a hash of this script and of the candidate versions of the
# kernel and of the listed packages, so a second run only asks apt for the
# versions (lists refreshed at most once a day; BERTH_VM_REFRESH=1 forces
# it) and finds the folder. apt runs with its own state folders under the
# cache: the host's apt setup, lists and locks are untouched.
# Pins: BERTH_VM_KERNEL=linux-image-6.12.118+deb13-amd64 picks the kernel
# package; the suites are fixed below.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
# shellcheck source=../lib/gobuild.sh
. "$REPO/hack/lib/gobuild.sh"
VM_CACHE="$CACHE_ROOT/vm"
MIRROR="${BERTH_VM_MIRROR:-http://deb.debian.org/debian}"
SECURITY_MIRROR="${BERTH_VM_SECURITY_MIRROR:-http://deb.debian.org/debian-security}"
KEYRING=/usr/share/keyrings/debian-archive-keyring.gpg
KERNEL_SUITE=trixie
ROOT_SUITE=bookworm
# What a node needs in its root: the node daemons, the kernel clients'
# user-space halves (mount.nfs, rbd map), file system tools, kmod for the
# module tree. The init is a shell script (from the node's config share):
# no systemd, which boots slowly under TCG.
ROOT_PACKAGES=(containerd runc containernetworking-plugins iptables conntrack nfs-common ceph-common
	util-linux mount e2fsprogs xfsprogs kmod iproute2 procps psmisc bash coreutils)
ROOT_SIZE=8G
export PATH="/usr/local/sbin:/usr/sbin:/sbin:$PATH"

log() { printf '[vm-image %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "error: $*"; exit 1; }

[ "$(id -u)" -eq 0 ] || die "run as root (mmdebstrap --mode=root, mke2fs of a root tree)"
"$REPO/hack/install-deps.sh" mmdebstrap qemu-utils kmod busybox-static xz-utils cpio e2fsprogs
# One build at a time (its apt state folders too): a second run waits,
# then finds the image cached.
cache_lock "$VM_CACHE/image"

# apt_state SUITE: a private apt setup for SUITE (sources, lists, cache,
# an empty dpkg status) under the cache; prints apt's -o options.
apt_state() {
	local suite=$1 d="$VM_CACHE/apt-$1"
	mkdir -p "$d/lists/partial" "$d/cache/archives/partial" "$d/parts"
	[ -f "$d/status" ] || : >"$d/status"
	cat >"$d/sources.list" <<EOF
deb [signed-by=$KEYRING] $MIRROR $suite main
deb [signed-by=$KEYRING] $MIRROR $suite-updates main
deb [signed-by=$KEYRING] $SECURITY_MIRROR $suite-security main
EOF
	echo "-o Dir::Etc::SourceList=$d/sources.list -o Dir::Etc::SourceParts=$d/parts" \
		"-o Dir::Etc::Preferences=/dev/null -o Dir::Etc::PreferencesParts=$d/parts" \
		"-o Dir::State::Lists=$d/lists -o Dir::Cache=$d/cache -o Dir::State::status=$d/status" \
		"-o Debug::NoLocking=1 -o APT::Architecture=amd64 -o APT::Architectures::=amd64 -o APT::Sandbox::User=root"
}

# apt_refresh SUITE: its lists, fetched at most once a day.
apt_refresh() {
	local d="$VM_CACHE/apt-$1" opts
	opts=$(apt_state "$1")
	if [ -n "${BERTH_VM_REFRESH:-}" ] || [ -z "$(find "$d/updated" -mmin -1440 2>/dev/null)" ]; then
		log "apt lists of $1 (own state in $d)"
		# shellcheck disable=SC2086
		timeout 300 apt-get $opts -qq update || die "apt-get update of $1 failed"
		touch "$d/updated"
	fi
}

# candidates SUITE PACKAGE...: "PACKAGE=VERSION" that apt would install,
# one apt-cache run for all (each run parses the whole lists).
candidates() {
	local opts suite=$1
	shift
	opts=$(apt_state "$suite")
	# shellcheck disable=SC2086
	apt-cache $opts policy "$@" | awk '/^[^ ].*:$/ {p = substr($0, 1, length($0) - 1)} /^  Candidate:/ {print p "=" $2}'
}

apt_refresh "$KERNEL_SUITE"
apt_refresh "$ROOT_SUITE"
kpkg=${BERTH_VM_KERNEL:-}
if [ -z "$kpkg" ]; then
	# The metapackage names the current ABI's image package.
	kopts=$(apt_state "$KERNEL_SUITE")
	# shellcheck disable=SC2086
	kpkg=$(apt-cache $kopts depends linux-image-amd64 | awk '/Depends: linux-image-6/ {print $2; exit}')
fi
[[ $kpkg == linux-image-6.12.*-amd64 ]] || die "kernel package '$kpkg' is not a Debian 13 6.12 amd64 image"
kver=${kpkg#linux-image-}
kpkgver=$(candidates "$KERNEL_SUITE" "$kpkg" | sed -n "s/^$kpkg=//p")
[ -n "$kpkgver" ] && [ "$kpkgver" != "(none)" ] || die "no candidate for $kpkg in $KERNEL_SUITE"

versions="$kpkg=$kpkgver $(candidates "$ROOT_SUITE" "${ROOT_PACKAGES[@]}" | tr '\n' ' ')"
for p in "${ROOT_PACKAGES[@]}"; do
	[[ " $versions" == *" $p="[0-9]* ]] || die "no candidate for $p in $ROOT_SUITE"
done
key=$( (cat "${BASH_SOURCE[0]}"; echo "$versions") | sha256sum | cut -c1-12)
OUT="$VM_CACHE/$kver-$key"
if [ -s "$OUT/rootfs.qcow2" ] && [ -s "$OUT/initrd.img" ] && [ -s "$OUT/vmlinuz" ]; then
	log "cached: $OUT"
	echo "$OUT"
	exit 0
fi

t0=$SECONDS
work="$VM_CACHE/build.$$"
cleanup() {
	# mmdebstrap unmounts its own; a failed run may leave the tree's mounts.
	local m
	for m in $(awk -v w="$work" '$5 ~ "^"w {print $5}' /proc/self/mountinfo | sort -r); do umount -l "$m" || true; done
	rm -rf --one-file-system "$work"
}
trap cleanup EXIT
rm -rf --one-file-system "$work"
mkdir -p "$work/kernel" "$work/initrd"

# --- kernel and modules -----------------------------------------------------
log "kernel $kpkg $kpkgver ($KERNEL_SUITE)"
kopts=$(apt_state "$KERNEL_SUITE")
# shellcheck disable=SC2086
(cd "$work" && timeout 600 apt-get $kopts -qq download "$kpkg=$kpkgver") || die "download of $kpkg failed"
dpkg-deb -x "$work"/linux-image-*.deb "$work/kernel"
moddir="$work/kernel/usr/lib/modules/$kver"
[ -d "$moddir" ] || die "no module tree in $kpkg"
# The package ships no modules.dep: without it modprobe finds nothing.
depmod -b "$work/kernel/usr" "$kver"

# --- root file system ---------------------------------------------------------
log "root file system: mmdebstrap $ROOT_SUITE (${ROOT_PACKAGES[*]})"
rootfs="$work/rootfs"
incl=$(
	IFS=,
	echo "${ROOT_PACKAGES[*]}"
)
# nice: the machine's CPU is shared; the timeout bounds a stuck mirror.
ticker() { while sleep 30; do log "  still building the root ($((SECONDS - t0))s)"; done; }
ticker &
tpid=$!
nice timeout 1800 mmdebstrap --quiet --mode=root --variant=minbase --include="$incl" \
	--aptopt='Acquire::Retries "3"' \
	--customize-hook='rm -f "$1"/etc/hostname "$1"/etc/resolv.conf' \
	--customize-hook='echo "LABEL=berth-root / ext4 defaults 0 1" >"$1/etc/fstab"' \
	"$ROOT_SUITE" "$rootfs" \
	"deb [signed-by=$KEYRING] $MIRROR $ROOT_SUITE main" \
	"deb [signed-by=$KEYRING] $MIRROR $ROOT_SUITE-updates main" \
	"deb [signed-by=$KEYRING] $SECURITY_MIRROR $ROOT_SUITE-security main" || {
	kill "$tpid"
	die "mmdebstrap failed"
}
kill "$tpid" 2>/dev/null || true
mkdir -p "$rootfs/usr/lib/modules"
cp -a "$moddir" "$rootfs/usr/lib/modules/"
# The mount point of the node's config share (the initrd mounts it there).
mkdir -p "$rootfs/mnt/berth-cfg"
{
	echo "$kpkg $kpkgver"
	chroot "$rootfs" dpkg-query -W -f '${Package} ${Version}\n'
} >"$work/versions.txt"
log "ext4 image of $(du -sh "$rootfs" | cut -f1) (sparse, $ROOT_SIZE)"
truncate -s "$ROOT_SIZE" "$work/rootfs.raw"
nice mke2fs -q -t ext4 -L berth-root -E root_owner=0:0 -d "$rootfs" "$work/rootfs.raw"
nice qemu-img convert -f raw -O qcow2 "$work/rootfs.raw" "$work/rootfs.qcow2"

# --- initrd: busybox, the boot modules (decompressed, in dependency order) ---
# It mounts the root disk and the config share, then hands over to the
# node's init from that share (hack/vm/guest/init), so that changing the
# init needs no image rebuild.
ird="$work/initrd"
mkdir -p "$ird"/{bin,dev,proc,sys,root,lib/modules}
cp /bin/busybox "$ird/bin/busybox"
for a in sh mount umount insmod mkdir switch_root sleep cat echo ls; do ln -s busybox "$ird/bin/$a"; done
n=0
for m in $(modprobe -d "$work/kernel/usr" -S "$kver" --show-depends -a virtio_blk ext4 virtio_net 9pnet_virtio 9p |
	awk '$1 == "insmod" {print $2}' | awk '!seen[$0]++'); do
	n=$((n + 1))
	xz -dc "$m" >"$ird/lib/modules/$(printf %02d "$n")-$(basename "${m%.xz}")"
done
cat >"$ird/init" <<'INIT'
#!/bin/sh
# initrd of a berth VM test node: boot modules, root disk, config share,
# then the node's init (from the share) on the root.
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
for m in /lib/modules/*.ko; do insmod "$m" || echo "initrd: insmod $m failed"; done
i=0
while [ ! -b /dev/vda ] && [ $i -lt 100 ]; do sleep 0.1; i=$((i + 1)); done
mount -t ext4 -o rw /dev/vda /root || { echo "initrd: no root disk"; sleep 5; echo o >/proc/sysrq-trigger; }
mount -t 9p -o trans=virtio,version=9p2000.L,ro,msize=262144 cfg /root/mnt/berth-cfg ||
	{ echo "initrd: no config share"; sleep 5; echo o >/proc/sysrq-trigger; }
umount /proc /sys
mount --move /dev /root/dev 2>/dev/null || umount /dev
exec switch_root /root /bin/bash /mnt/berth-cfg/bin/init
INIT
chmod 755 "$ird/init"
(cd "$ird" && find . | cpio -o -H newc --quiet | gzip -1) >"$work/initrd.img"
cp "$work/kernel/boot/vmlinuz-$kver" "$work/vmlinuz"

mkdir -p "$OUT"
mv "$work/vmlinuz" "$work/initrd.img" "$work/versions.txt" "$OUT/"
mv "$work/rootfs.qcow2" "$OUT/rootfs.qcow2"
log "built $OUT in $((SECONDS - t0))s (rootfs $(du -h "$OUT/rootfs.qcow2" | cut -f1))"
echo "$OUT"
