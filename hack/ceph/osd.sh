#!/usr/bin/env bash
# Takes one OSD of the test Ceph down or brings it back, for tests of I/O
# while an OSD is gone.
#   hack/ceph/osd.sh kill ID    SIGKILL (a crash), wait until the monitor sees it down
#   hack/ceph/osd.sh start ID   start it again, wait until it is up
# hack/ceph/up.sh afterwards also waits until every placement group is clean.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=lib.sh
. "$HERE/lib.sh"

[ $# -eq 2 ] || die "usage: $0 kill|start ID"
id=$2
[[ "$id" =~ ^[0-9]+$ ]] && [ "$id" -lt "$OSD_COUNT" ] || die "no OSD $id (0..$((OSD_COUNT - 1)))"
[ -f "$READY" ] || die "no test Ceph in $CEPH_DIR (hack/ceph/up.sh)"
case $1 in
kill)
	if pid=$(pid_of "osd.$id"); then
		stop_pid "$pid" 20 KILL
		rm -f "$PIDS/osd.$id.pid"
		log "killed osd.$id (pid $pid)"
	fi
	wait_for "osd.$id marked down" osds_up $((OSD_COUNT - 1))
	;;
start)
	pid_of "osd.$id" >/dev/null || start_daemon "osd.$id"
	wait_for "osd.$id up" osds_up "$OSD_COUNT"
	;;
*) die "usage: $0 kill|start ID" ;;
esac
