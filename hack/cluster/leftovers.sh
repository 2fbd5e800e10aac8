#!/usr/bin/env bash
# Lists whatever the e2e cluster left on this machine after down.sh:
# processes, mounts, mount namespaces, loop devices, cgroups, network
# namespaces, interfaces, changed sysctls, host folders. Exit 1 if anything remains.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=lib.sh
. "$HERE/lib.sh"
# shellcheck source=../vm/vm.sh
. "$HERE/../vm/vm.sh"

found=0
report() { [ -z "$2" ] || { printf 'leftover %s:\n%s\n' "$1" "$2" >&2; found=1; }; }

procs=$(procs_matching "$WORKDIR")
report processes "$procs"
report mounts "$(grep -F -e "$WORKDIR" -e "/run/netns/$NETNS" -e " $BERTH_RUN_DIR" /proc/self/mountinfo || true)"
# Backing files of the nodes' loop devices read as the node saw them.
report "loop devices" "$(losetup -nl -O NAME,BACK-FILE 2>/dev/null | grep -F -e "$WORKDIR" -e "$KUBELET_ROOT/" || true)"
report cgroups "$(ls -d /sys/fs/cgroup/*/"$CGROUP_NAME" 2>/dev/null || true)"
report netns "$(ip netns list | grep -E "^$NETNS(-n[0-9]+)?( |$)" || true)"
report interfaces "$(ip -br link | grep -E "^($HOST_IF|$BRIDGE|$HUB_BRIDGE)[@ ]" || true)"
report "mount namespace files" "$(ls "$MNTNS_DIR" 2>/dev/null || true)"
report "node folders" "$(ls "$NODES_DIR" 2>/dev/null || true)"
report "multus files" "$(ls -d "$CNI_BIN_DIR" "$MULTUS_MARK" 2>/dev/null || true)"
# VM nodes: qemu, taps, disks (hack/vm/vm.sh).
vm_leftovers
# The test Ceph of ceph.sh: processes, listening sockets, folder, netns.
"$HERE/ceph.sh" leftovers || found=1
if [ -f "$HOST_CREATED" ]; then report "host paths made by the cluster" "$(cat "$HOST_CREATED")"; fi
if [ -f "$SYSCTL_SAVED" ]; then report "saved sysctls (down.sh did not restore them)" "$(cat "$SYSCTL_SAVED")"; fi
if [ "$found" -eq 0 ]; then log "nothing left behind"; fi
exit "$found"
