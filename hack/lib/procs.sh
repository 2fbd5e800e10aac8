# Process helpers shared by hack/cluster and hack/ceph (sourced, not run).
# Both start daemons in the background, record "PID\nEXE" in a pid file, and
# stop them by that PID only; these helpers are that common part. The sourcing
# script may define log(); without it messages go to stderr.

# pidfile_pid FILE prints the PID recorded in FILE if that process still runs
# the recorded binary (a recycled PID is not ours).
pidfile_pid() {
	local pid exe
	[ -f "$1" ] || return 1
	{ read -r pid && read -r exe; } <"$1" || return 1
	[ -n "$pid" ] && [ "$(readlink "/proc/$pid/exe" 2>/dev/null)" = "$exe" ] || return 1
	echo "$pid"
}

# stop_pid PID [SECONDS] [SIGNAL]: SIGNAL (default TERM), wait up to SECONDS
# (default 10) for the process to go, then SIGKILL.
stop_pid() {
	local pid=$1 wait=${2:-10} sig=${3:-TERM} i
	kill "-$sig" "$pid" 2>/dev/null || return 0
	for ((i = 0; i < wait * 10; i++)); do
		[ -d "/proc/$pid" ] || return 0
		# A zombie child of ours counts as gone.
		grep -q '^State:.*Z' "/proc/$pid/status" 2>/dev/null && return 0
		sleep 0.1
	done
	if declare -F log >/dev/null; then
		log "pid $pid still runs ${wait}s after SIG$sig: SIGKILL"
	else
		echo "pid $pid still runs ${wait}s after SIG$sig: SIGKILL" >&2
	fi
	kill -KILL "$pid" 2>/dev/null || true
}

# procs_matching STR...: "PID CMDLINE" of every process whose command line
# (arguments joined by spaces) contains any STR. Bash builtins only, so the
# search does not find itself.
procs_matching() {
	local f pid cmd s
	local -a args
	for f in /proc/[0-9]*/cmdline; do
		pid=${f#/proc/}
		pid=${pid%/cmdline}
		[ "$pid" = "$$" ] || [ "$pid" = "$BASHPID" ] && continue
		mapfile -d '' -t args 2>/dev/null <"$f" || continue
		cmd="${args[*]}"
		for s in "$@"; do
			case "$cmd" in *"$s"*) echo "$pid ${cmd:0:150}"; break ;; esac
		done
	done
}
