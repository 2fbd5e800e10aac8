#!/usr/bin/env bash
# Lists whatever the test Ceph left after hack/ceph/down.sh: processes
# running from its folder, sockets listening on its ports, the folder.
# Exit 1 if anything remains.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=lib.sh
. "$HERE/lib.sh"

found=0
report() { [ -z "$2" ] || { printf 'leftover %s:\n%s\n' "$1" "$2" >&2; found=1; }; }

report processes "$(procs_matching "$CEPH_DIR/")"
# Ceph daemons listening on the monitor's port or the daemons' range (in
# CEPH_NETNS when set and still there).
ports=""
if [ -z "$CEPH_NETNS" ] || ip netns list | grep -qE "^$CEPH_NETNS( |$)"; then
	ports=$(in_ns ss -Hltnp | awk -v mon="$MON_PORT" -v lo="$PORT_MIN" -v hi="$PORT_MAX" '
		{ n = split($4, a, ":"); p = a[n] + 0 }
		(p == mon || (p >= lo && p <= hi)) && /ceph-/' || true)
fi
report "listening sockets" "$ports"
report folder "$(ls -d "$CEPH_DIR" 2>/dev/null || true)"
[ "$found" -ne 0 ] || log "nothing left behind"
exit "$found"
