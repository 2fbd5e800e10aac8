#!/usr/bin/env bash
# Compares the userspace block device (berth keeper + berth blockdev, FUSE file
# + loop) with a kernel loop device on a plain image, both --direct-io=on,
# with fio direct=1 on the raw devices. Prints one table row per workload.
#   hack/bench-blockdev.sh [seconds-per-run] [image-size]
# Each row is the median of BENCH_ROUNDS (default 3) alternating runs per side.
# Env: BENCH_ROUNDS, BERTH_BLOCKDEV_WORKERS, BERTH_BLOCKDEV_PASSTHROUGH=true, BENCH_ONLY=regex.
# Needs root, fio, losetup. Removes everything it made, also on failure.
set -euo pipefail

runtime=${1:-10}
size=${2:-1G}
rounds=${BENCH_ROUNDS:-3}
workers=${BERTH_BLOCKDEV_WORKERS:-0}
passthrough=${BERTH_BLOCKDEV_PASSTHROUGH:-false} # true: kernel does data I/O on the image
root=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d /var/tmp/berth-bench-XXXXXX)
keeper_pid="" server_pid="" kloop="" uloop=""

cleanup() {
	set +e
	[ -n "$uloop" ] && losetup -d "$uloop"
	[ -n "$kloop" ] && losetup -d "$kloop"
	[ -n "$server_pid" ] && kill "$server_pid" && wait "$server_pid" 2>/dev/null
	[ -n "$keeper_pid" ] && kill "$keeper_pid" && wait "$keeper_pid" 2>/dev/null
	grep -q " $work/fuse " /proc/self/mountinfo && umount -l "$work/fuse"
	rm -rf "$work"
}
trap cleanup EXIT

make --no-print-directory -s -C "$root" build BIN="$work"
truncate -s "$size" "$work/kernel.img" "$work/user.img"

# No wait for a hand-over at the end: nothing takes over.
"$work/berth" keeper --socket "$work/run/keeper.sock" --hand-over-wait 0 2>"$work/keeper.log" &
keeper_pid=$!
for _ in $(seq 100); do [ -S "$work/run/keeper.sock" ] && break; sleep 0.05; done
"$work/berth" blockdev --keeper-socket "$work/run/keeper.sock" --volume bench \
	--image "$work/user.img" --mountpoint "$work/fuse" --workers "$workers" --passthrough="$passthrough" 2>"$work/server.log" &
server_pid=$!
for _ in $(seq 100); do [ -e "$work/fuse/disk.img" ] && break; sleep 0.05; done

kloop=$(losetup --direct-io=on --find --show "$work/kernel.img")
uloop=$(losetup --direct-io=on --find --show "$work/fuse/disk.img")

# Fill both images so reads hit real blocks, not holes.
for dev in "$kloop" "$uloop"; do
	fio --name=fill --filename="$dev" --rw=write --bs=1M --iodepth=8 --ioengine=libaio \
		--direct=1 --size="$size" --output=/dev/null
done

# fio terse v3: field 8 read IOPS, 7 read KB/s, 40 read clat mean (us);
# 49 write IOPS, 48 write KB/s, 81 write clat mean (us).
measure() { # dev name rw bs depth -> "iops kbps lat_us"
	local out
	out=$(fio --name="$2" --filename="$1" --rw="$3" --bs="$4" --iodepth="$5" \
		--ioengine=libaio --direct=1 --time_based --runtime="$runtime" --size="$size" \
		--randrepeat=0 --norandommap --output-format=terse --terse-version=3)
	case $3 in
	*read) awk -F';' '{print $8, $7, $40}' <<<"$out" ;;
	*) awk -F';' '{print $49, $48, $81}' <<<"$out" ;;
	esac
}

# median of the arguments (odd count: the middle one)
median() { printf '%s\n' "$@" | sort -g | awk '{v[NR]=$1} END {print v[int((NR+1)/2)]}'; }

printf '%-22s %12s %12s %7s %12s %12s %7s\n' workload kernel user ratio kernel-lat user-lat lat-x
row() { # label rw bs depth; BENCH_ONLY=regex selects rows
	[[ -z ${BENCH_ONLY:-} || $1 =~ $BENCH_ONLY ]] || return 0
	# Kernel and user runs alternate, BENCH_ROUNDS times, and each side
	# reports its median: on a shared 2-core machine one run alone can be
	# off by half when something else runs at the same time.
	local ki=() kb=() kl=() ui=() ub=() ul=() i a b c
	for ((i = 0; i < rounds; i++)); do
		read -r a b c < <(measure "$kloop" "$1" "$2" "$3" "$4")
		ki+=("$a") kb+=("$b") kl+=("$c")
		read -r a b c < <(measure "$uloop" "$1" "$2" "$3" "$4")
		ui+=("$a") ub+=("$b") ul+=("$c")
	done
	case $3 in
	4k) k=$(median "${ki[@]}") u=$(median "${ui[@]}") unit=IOPS ;;
	*) k=$(($(median "${kb[@]}") / 1024)) u=$(($(median "${ub[@]}") / 1024)) unit=MiB/s ;;
	esac
	k_lat=$(median "${kl[@]}") u_lat=$(median "${ul[@]}")
	printf '%-22s %12s %12s %7.2f %10.0fus %10.0fus %7.2f\n' "$1 ($unit)" "$k" "$u" \
		"$(awk -v a="$u" -v b="$k" 'BEGIN{print (b>0)?a/b:0}')" "$k_lat" "$u_lat" \
		"$(awk -v a="$u_lat" -v b="$k_lat" 'BEGIN{print (b>0)?a/b:0}')"
}
row "4k randread QD64" randread 4k 64
row "4k randwrite QD64" randwrite 4k 64
row "128k read QD16" read 128k 16
row "128k write QD16" write 128k 16
row "4k randread QD1" randread 4k 1
row "4k randwrite QD1" randwrite 4k 1
