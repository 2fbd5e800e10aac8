#!/usr/bin/env bash
# Runs a command as root in a VM node of the e2e cluster, through the
# node's command agent (no network: it works while the node is cut off).
#
#   hack/vm/exec.sh NODE [-i] CMD...    -i: pass this stdin
#
# NODE is a name (berth-e2e-node-3) or an index. Exit status: CMD's; 124
# after VM_EXEC_TIMEOUT seconds (default 600); 125 when the VM is off.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=../cluster/lib.sh
. "$HERE/../cluster/lib.sh"
. "$HERE/../cluster/nodes.sh"
. "$HERE/vm.sh"

[ $# -ge 2 ] || die "usage: $0 NODE [-i] CMD..."
[ "$(id -u)" -eq 0 ] || die "run as root"
i=$(node_index "$1") || die "no node $1"
node_is_vm "$i" || die "$(node_name "$i") is not a VM node (nsenter into its namespaces instead)"
shift
opt=()
[ "$1" = -i ] && { opt=(-i); shift; }
rc=0
vm_exec "${opt[@]}" "$i" "$@" || rc=$?
[ "$rc" -ne 125 ] || log "$(node_name "$i") is powered off"
exit "$rc"
