# A CPU cgroup for work that should take only what the rest leaves
# (sourced, not run). hack/test.sh runs the Go tests in one while the
# cluster tiers run in the foreground.
#
# Why a cgroup and not nice: this kernel groups tasks by session
# (kernel.sched_autogroup_enabled=1) and every daemon of a test cluster runs
# in a session of its own (setsid), so a nice value only orders tasks
# within one session. A cgroup's CPU weight is what the scheduler weighs
# against the sessions of the root group. Works on cgroup v1 (cpu.shares)
# and v2 (cpu.weight); where neither can be made, cpushare_create fails and
# the caller says so.

# cpushare_create NAME SHARES: makes (or reuses) the cgroup NAME with the
# v1 weight SHARES (1024 is a normal session's) and prints its folder.
cpushare_create() {
	local name=$1 shares=$2 dir
	if [ -d /sys/fs/cgroup/cpu ] && [ -f /sys/fs/cgroup/cpu/cpu.shares ]; then
		dir=/sys/fs/cgroup/cpu/$name
		mkdir -p "$dir" 2>/dev/null && echo "$shares" >"$dir/cpu.shares" 2>/dev/null || return 1
	elif [ -f /sys/fs/cgroup/cgroup.controllers ] && grep -qw cpu /sys/fs/cgroup/cgroup.controllers; then
		dir=/sys/fs/cgroup/$name
		grep -qw cpu /sys/fs/cgroup/cgroup.subtree_control ||
			echo +cpu >/sys/fs/cgroup/cgroup.subtree_control 2>/dev/null || return 1
		# v2's weight: 100 is v1's 1024.
		mkdir -p "$dir" 2>/dev/null && echo $((shares * 100 / 1024 > 0 ? shares * 100 / 1024 : 1)) >"$dir/cpu.weight" 2>/dev/null || return 1
	else
		return 1
	fi
	echo "$dir"
}

# cpushare_run DIR CMD...: runs CMD in the cgroup DIR (its children stay
# there too).
cpushare_run() {
	local dir=$1
	shift
	bash -c 'echo $$ >"$1/cgroup.procs" && shift && exec "$@"' cpushare "$dir" "$@"
}

# cpushare_remove DIR: removes the cgroup once its processes are gone
# (waits up to 10 s for them to exit).
cpushare_remove() {
	local dir=$1 i
	[ -d "$dir" ] || return 0
	for ((i = 0; i < 100; i++)); do
		rmdir "$dir" 2>/dev/null && return 0
		sleep 0.1
	done
	echo "cpushare: $dir still has processes: $(cat "$dir/cgroup.procs" 2>/dev/null | tr '\n' ' ')" >&2
	return 1
}
