#!/usr/bin/env bash
# Installs the Debian packages berth's tests and dev environment use, only
# those missing, so that a second run costs a dpkg query.
#   hack/install-deps.sh [package ...]     default: the test set
#   hack/install-deps.sh --ceph-build      what `make build` (CEPH=1) needs
# BERTH_DEPS_LIST=1 prints the packages, one a line, and installs nothing.
set -euo pipefail

pkgs=("$@")
if [ "${1:-}" = --ceph-build ]; then
	# The ceph backend is cgo (go-ceph) against Ceph's C libraries.
	pkgs=(gcc libc6-dev librbd-dev librados-dev)
elif [ ${#pkgs[@]} -eq 0 ]; then
	# mkfs/resize for ext4 and xfs, losetup/mount/blockdev, fio for verifying
	# writers and benchmarks, nfs-ganesha with its VFS FSAL for the RWX share
	# manager's root tests, nfs-common's mount.nfs (with netbase's
	# /etc/protocols) for the berth image (the kernel NFS client of VM
	# nodes); busybox-static, from which the image tests build their images
	# (they skip without it).
	pkgs=(e2fsprogs xfsprogs util-linux mount fio nfs-ganesha nfs-ganesha-vfs nfs-common netbase busybox-static)
fi

if [ "${BERTH_DEPS_LIST:-}" = 1 ]; then
	printf '%s\n' "${pkgs[@]}"
	exit 0
fi
missing=()
for p in "${pkgs[@]}"; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0

if [ "$(id -u)" -ne 0 ]; then
	echo "install-deps: missing ${missing[*]}; run as root or install them" >&2
	[ "${1:-}" = --ceph-build ] && echo "install-deps: or build without the ceph backend: make build CEPH=0" >&2
	exit 1
fi
echo "install-deps: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
# Another install may run beside this one (CI's prebuild beside a test's):
# wait for dpkg's lock rather than fail.
apt-get -o DPkg::Lock::Timeout=300 update -qq >/dev/null
apt-get -o DPkg::Lock::Timeout=300 install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
