#!/usr/bin/env bash
# Stops the test Ceph hack/ceph/up.sh started, each daemon by the PID it
# recorded, and removes its folder. Nothing up: nothing to do, exit 0.
# Exit 1 when a process still runs from the folder (not ours to kill by name:
# hack/ceph/leftovers.sh lists it).
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=lib.sh
. "$HERE/lib.sh"

[ -e "$CEPH_DIR" ] || exit 0
# OSDs and mgr first, the monitor last, so that none of them waits on a
# gone monitor while shutting down.
for ((i = ${#DAEMONS[@]} - 1; i >= 0; i--)); do
	d=${DAEMONS[$i]}
	if pid=$(pid_of "$d"); then
		log "stopping $d (pid $pid)"
		stop_pid "$pid" 20
	fi
done
left=$(procs_matching "$CEPH_DIR/")
[ -z "$left" ] || die "processes still use $CEPH_DIR (not started by up.sh, or not stopped):
$left"
rm -rf "$CEPH_DIR"
log "down: $CEPH_DIR removed"
