#!/usr/bin/env bash
# Installs the Debian packages berth's tests and dev environment use, only
# those missing, so that a second run costs a dpkg query.
#   hack/install-deps.sh [package ...]     default: the test set
set -euo pipefail

pkgs=("$@")
if [ ${#pkgs[@]} -eq 0 ]; then
	# mkfs/resize for ext4 and xfs, losetup/mount/blockdev, fio for verifying
	# writers and benchmarks, nfs-ganesha with its VFS FSAL for the RWX share
	# manager's root tests.
	pkgs=(e2fsprogs xfsprogs util-linux mount fio nfs-ganesha nfs-ganesha-vfs)
fi

missing=()
for p in "${pkgs[@]}"; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0

if [ "$(id -u)" -ne 0 ]; then
	echo "install-deps: missing ${missing[*]}; run as root or install them" >&2
	exit 1
fi
echo "install-deps: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >/dev/null
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
