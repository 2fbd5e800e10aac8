# VM test nodes of the e2e cluster (sourced by hack/cluster's up.sh,
# node.sh, down.sh and leftovers.sh after lib.sh and nodes.sh).
#
# A VM node is a qemu guest (TCG: /dev/kvm here runs no stock kernel) with
# Debian 13's kernel and the root image of hack/vm/image.sh. It is node I of
# the cluster like any other (name, IP, pod CIDR, certificates and configs
# of hack/cluster), but its kernel, mounts and block devices are its own:
# the kernel NFS client, nbd and krbd work there, and a power-off (SIGKILL
# of qemu) loses them at once, as a real one does.
#
#   - network: a tap device $(node_hub_if I) on the hub's node bridge,
#     made inside the hub netns, where qemu runs; no user networking, no
#     route but those to the hub and the other nodes;
#   - disk: $(vm_dir I)/disk.qcow2, a qcow2 overlay on the cached root
#     image: the node's own persistent state, the image never written;
#   - shares (9p): cfg (read-only: node.env, the guest scripts of
#     hack/vm/guest, the node's files under root/), kube (the kubelet and
#     kube-proxy binaries, read-only), images ($IMAGES, read-only, at the
#     same path in the guest), cmd (read-write: vm_exec's spool);
#   - console: $(node_dir I)/logs/qemu.log (serial on qemu's stdout, with
#     qemu's own messages; the previous boot's in qemu.log.prev).

VM_HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=../lib/gobuild.sh
. "$VM_HERE/../lib/gobuild.sh"
# image.sh's cache (down.sh --purge removes it).
VM_CACHE="$CACHE_ROOT/vm"
VM_NODES_LIST="$WORKDIR/vm-nodes.list"
VM_IMAGE_FILE="$WORKDIR/vm-image"
VM_NODE_COUNT="${BERTH_E2E_VM_NODES:-0}"
# One VM is ~2 GiB of the machine's 24 and both of its cores (TCG).
VM_MEMORY="${BERTH_E2E_VM_MEMORY:-2048}"
VM_CPUS="${BERTH_E2E_VM_CPUS:-2}"
# How qemu runs the guest's CPUs: one host thread each (multi) or one for
# all (single). Under multi, qemu 7.2 sometimes runs a stale copy of kernel
# code that the guest is patching (a static key flipped on another CPU):
# two panics seen with the instruction pointer inside a jmp. single has
# none of that, but berth's install took 3m18s to Ready instead of 1m51s.
# (Two were in the CFS bandwidth code, whose static key flips with the
# first and last CFS quota: VM kubelets set no quota, vm_write_files.)
VM_TCG_THREAD="${BERTH_E2E_VM_TCG_THREAD:-multi}"
QEMU=/usr/bin/qemu-system-x86_64

vm_indexes() { cat "$VM_NODES_LIST" 2>/dev/null || true; }
node_is_vm() { grep -qx "$1" "$VM_NODES_LIST" 2>/dev/null; }
vm_dir() { echo "$(node_dir "$1")/vm"; }
vm_mac() { printf '52:54:00:be:e2:%02x' "$1"; }

# vm_image: the cached kernel, initrd and root image (built on first use).
vm_image() {
	local d
	d=$(ticking "building the VM image" "$VM_HERE/image.sh" | tail -n1)
	[ -s "$d/rootfs.qcow2" ] || die "hack/vm/image.sh gave no image"
	echo "$d" >"$VM_IMAGE_FILE"
	echo "$d"
}

# vm_setup_net I: node I's tap on the hub bridge, and the hub's route to
# its pods (as setup_node_net does for a netns node).
vm_setup_net() {
	local i=$1 tap
	tap=$(node_hub_if "$i")
	if ! ip -n "$NETNS" link show "$tap" >/dev/null 2>&1; then
		log "tap $tap in $NETNS for $(node_name "$i") ($(node_ip "$i"))"
		ip -n "$NETNS" tuntap add dev "$tap" mode tap
	fi
	ip -n "$NETNS" link set "$tap" master "$HUB_BRIDGE" up
	ip -n "$NETNS" route replace "$(node_pod_cidr "$i")" via "$(node_ip "$i")"
}

# vm_write_files I: the cfg share of node I: node.env, the guest scripts,
# and under root/ the node's files at their host paths (written by
# write_node_configs, make_pki and kube_proxy_pki), no other key.
vm_write_files() {
	local i=$1 name dir cfg root j routes
	name=$(node_name "$i") dir=$(node_dir "$i") cfg="$(vm_dir "$i")/cfg"
	root="$cfg/root"
	# Its contents anew, the folder kept: a running guest's share is that
	# folder (qemu holds it open), a new one would be out of its sight.
	mkdir -p "$cfg"
	rm -rf "${cfg:?}/bin" "$root"
	mkdir -p "$cfg/bin" "$root$dir" "$root$PKI" "$root$CONF"
	cp "$VM_HERE"/guest/* "$cfg/bin/"
	cp -r "$dir/config" "$dir/cni-conf" "$root$dir/"
	# CRI unpacks an image inside CreateContainer (vm_ctr imports without
	# unpacking); under TCG the berth image took over kubelet's default 2
	# minutes, and each retry started the unpack anew.
	sed -i '/^runtimeRequestTimeout:/d' "$root$dir/config/kubelet.yaml"
	# Pod syncs at kubelet's default pace: every sync costs the TCG guest.
	sed -i '/^syncFrequency:/d' "$root$dir/config/kubelet.yaml"
	echo "runtimeRequestTimeout: 15m0s" >>"$root$dir/config/kubelet.yaml"
	# No CFS quota on a VM node: the kernel flips its cfs_bandwidth_used
	# static key whenever the count of cgroups with a quota crosses zero
	# (a pod with a CPU limit made or gone), and multi-threaded TCG has run
	# stale code while the guest patched it: kernel panics in
	# update_cfs_group and pick_task_fair (a cold CI run's VM tier lost its
	# node so). Limits then bound nothing on VM nodes; nothing tests them.
	echo "cpuCFSQuota: false" >>"$root$dir/config/kubelet.yaml"
	cp "$PKI/ca.crt" "$PKI/kubelet-$name.crt" "$PKI/kubelet-$name.key" "$PKI/kube-proxy.crt" "$PKI/kube-proxy.key" "$root$PKI/"
	# kube-proxy's config as dns.sh writes it for a netns node, without
	# starting one here (the guest runs it).
	(
		launch() { :; }
		wait_for() { :; }
		start_kube_proxy "$name" none "$(node_ip "$i")"
	)
	cp "$CONF/kube-proxy.kubeconfig" "$CONF/kube-proxy-$name.yaml" "$root$CONF/"
	routes="$HUB_IP/32@$HUB_BRIDGE_IP $SERVICE_CIDR@$HUB_BRIDGE_IP"
	for j in $(node_indexes); do
		[ "$j" = "$i" ] || routes+=" $(node_pod_cidr "$j")@$(node_ip "$j")"
	done
	cat >"$cfg/node.env.tmp" <<ENV
NODE_NAME=$name
NODE_IP=$(node_ip "$i")
NODE_PREFIX_LEN=24
NODE_ROUTES="$routes"
IMAGES_DIR=$IMAGES
CONTAINERD_CONFIG=$dir/config/containerd.toml
CONTAINERD_SOCK=$(node_sock "$i")
KUBELET_CONFIG=$dir/config/kubelet.yaml
KUBELET_KUBECONFIG=$dir/config/kubelet.kubeconfig
KUBE_PROXY_CONFIG=$CONF/kube-proxy-$name.yaml
PAUSE_IMAGE=$PAUSE_IMAGE
CGROUP_ROOT=/$(node_cgroup "$i")
ENV
	mv "$cfg/node.env.tmp" "$cfg/node.env"
}

# vm_running I: qemu of node I runs (its PID, by pid_of).
vm_running() { pid_of "qemu@$1" >/dev/null; }

# vm_boot I: starts qemu of node I on its disk (made on first boot: an
# overlay on the image), in the hub netns; returns once its command agent
# answers.
vm_boot() {
	local i=$1 name dir vdir disk img
	name=$(node_name "$i") dir=$(node_dir "$i") vdir=$(vm_dir "$i")
	disk="$vdir/disk.qcow2"
	if vm_running "$i"; then log "$name already runs (qemu $(pid_of "qemu@$i"))"; return 0; fi
	mkdir -p "$vdir/cmd" "$dir/logs"
	# The disk stays with the image it was made on: its module tree must
	# match the kernel that boots it.
	img=$(cat "$vdir/image" 2>/dev/null || true)
	if [ ! -s "$disk" ] || [ ! -s "$img/rootfs.qcow2" ]; then
		img=$(cat "$VM_IMAGE_FILE" 2>/dev/null || true)
		[ -s "$img/rootfs.qcow2" ] || img=$(vm_image)
		log "disk of $name: overlay on $img/rootfs.qcow2"
		rm -f "$disk"
		qemu-img create -q -f qcow2 -F qcow2 -b "$img/rootfs.qcow2" "$disk"
		echo "$img" >"$vdir/image"
	fi
	rm -f "$vdir"/cmd/*
	# -nodefaults: no default NIC (no user networking), no other device;
	# panic=-1 with -no-reboot: a kernel panic ends qemu (a dead node);
	# no_timer_check: on a busy machine the emulated CPU is too slow for the
	# kernel's IO-APIC timer check, which then panics ("IO-APIC + timer
	# doesn't work!", seen here at load 15); mitigations=off: a test
	# guest of our own code needs no defence against speculation, and its
	# retpolines and RSB fills are emulated instructions on every indirect
	# call and context switch.
	# A guest kernel once panicked 29 s into its boot under TCG (an oops in
	# the page allocator, in mkdir): such a boot is tried once more rather
	# than failing the whole bring-up after the 300 s wait.
	local try
	for try in 1 2; do
		launch "qemu@$i" "$dir/logs/qemu.log" "" --net="/run/netns/$NETNS" -- \
			"$QEMU" -name "$name" -nodefaults -no-user-config -display none -no-reboot \
			-accel "tcg,thread=$VM_TCG_THREAD" -cpu max -smp "$VM_CPUS" -m "$VM_MEMORY" -rtc base=utc \
			-kernel "$img/vmlinuz" -initrd "$img/initrd.img" -append "console=ttyS0 loglevel=4 panic=-1 no_timer_check mitigations=off" \
			-serial stdio \
			-drive "file=$disk,if=virtio,format=qcow2,cache=unsafe,discard=unmap" \
			-netdev "tap,id=net0,ifname=$(node_hub_if "$i"),script=no,downscript=no" \
			-device "virtio-net-pci,netdev=net0,mac=$(vm_mac "$i")" \
			-device virtio-rng-pci \
			-virtfs "local,path=$vdir/cfg,mount_tag=cfg,security_model=none,readonly=on" \
			-virtfs "local,path=$KUBE_BIN,mount_tag=kube,security_model=none,readonly=on" \
			-virtfs "local,path=$IMAGES,mount_tag=images,security_model=none,readonly=on" \
			-virtfs "local,path=$vdir/cmd,mount_tag=cmd,security_model=none"
		if (wait_for "$name booted (command agent)" 300 "qemu@$i" vm_poll_boot "$i" "$dir/logs/qemu.log"); then
			return 0
		fi
		if [ "$try" = 1 ] && grep -q "Kernel panic" "$dir/logs/qemu.log"; then
			log "$name: its kernel panicked while booting (console in $dir/logs/qemu.log.prev); booting it once more"
			vm_poweroff "$i"
			continue
		fi
		die "$name did not boot (console: $dir/logs/qemu.log)"
	done
}

# vm_poll_boot I CONSOLE: the command agent of node I answers; a kernel
# panic on CONSOLE ends qemu at once, so that vm_boot need not wait out
# its timeout (the guest's kernel.panic=0 keeps a panicked kernel halted).
vm_poll_boot() {
	if grep -q "Kernel panic" "$2" 2>/dev/null; then
		vm_poweroff "$1" >/dev/null 2>&1 || true
		return 1
	fi
	vm_poll "$1" true
}

# vm_exec [-i] I CMD...: runs CMD in node I as root through the spool of
# its cmd share; its stdout and stderr come back, and its exit status (124
# after VM_EXEC_TIMEOUT seconds, default 600; 125 when the VM does not
# run). -i passes this stdin (read to its end first).
vm_exec() {
	local stdin= i spool id limit=${VM_EXEC_TIMEOUT:-600} start=$SECONDS rc
	[ "$1" = -i ] && { stdin=1; shift; }
	i=$1
	shift
	spool="$(vm_dir "$i")/cmd"
	vm_running "$i" || return 125
	id="h$$-$RANDOM$RANDOM"
	[ -z "$stdin" ] || cat >"$spool/$id.in"
	printf '%q ' "$@" >"$spool/$id.sh.tmp"
	mv "$spool/$id.sh.tmp" "$spool/$id.sh"
	until [ -e "$spool/$id.rc" ]; do
		if ((SECONDS - start >= limit)) || ! vm_running "$i"; then
			rm -f "$spool/$id".*
			vm_running "$i" && return 124
			return 125
		fi
		sleep 0.1
	done
	cat "$spool/$id.out"
	cat "$spool/$id.err" >&2
	rc=$(cat "$spool/$id.rc")
	rm -f "$spool/$id".*
	return "$rc"
}

# vm_poll I CMD...: vm_exec for a wait_for poll, which then keeps its own
# time limit (a guest whose agent is not up yet does not block it).
vm_poll() { VM_EXEC_TIMEOUT=15 vm_exec "$@"; }

# vm_ctr I ARGS...: ctr of node I's containerd (namespace k8s.io) through
# its command channel. An image import there does not unpack, but for the
# sandbox image: CRI unpacks an image when a container first uses it, so
# the guest unpacks (about a minute for 30 MB under TCG) only what it runs.
vm_ctr() {
	local i=$1
	shift
	if [ "${1:-} ${2:-}" = "images import" ] && [[ " $* " != *" $IMAGES/pause.tar "* ]]; then
		set -- images import --no-unpack "${@:3}"
	fi
	vm_exec "$i" ctr -a "$(node_sock "$i")" -n k8s.io "$@"
}

# vm_start_node I: boots node I if it is off (its init starts the node),
# starts containerd if it is not running (a node stop), imports the images
# into it, then starts kubelet and kube-proxy if they are not running.
vm_start_node() {
	local i=$1 name
	name=$(node_name "$i")
	# The guest runs its scripts from the share: this checkout's apply.
	cp "$VM_HERE"/guest/* "$(vm_dir "$i")/cfg/bin/"
	vm_boot "$i"
	vm_exec "$i" berth-node containerd >/dev/null 2>&1 || true
	wait_for "containerd of $name ready" 300 "qemu@$i" vm_poll "$i" ctr -a "$(node_sock "$i")" version
	if declare -F build_and_import_images >/dev/null; then
		VM_IMPORT_INDEX=$i
		ctr_() { vm_ctr "$VM_IMPORT_INDEX" "$@"; }
		IMPORT_NODE=$name build_and_import_images
	fi
	vm_exec "$i" berth-node start >/dev/null
}

# vm_ready_since NAME EPOCH: node NAME Ready by a kubelet heartbeat at or
# after EPOCH: after a power-off or a stop the API still says Ready for the
# 40 s of the controller-manager's grace period, from the kubelet that died.
vm_ready_since() {
	local out
	out=$(kctl get node "$1" -o jsonpath='{range .status.conditions[?(@.type=="Ready")]}{.status} {.lastHeartbeatTime}{end}') || return 1
	[ "${out%% *}" = True ] && [ "$(date -d "${out#* }" +%s)" -ge "$2" ]
}

# The taint of a VM node: the scheduler puts Deployments' pods (CoreDNS,
# snapshot-controller, berth's CSI controller) elsewhere when it can, as
# each image a VM runs is unpacked there under TCG; DaemonSets and pods
# bound to the node run there all the same.
VM_TAINT=berth.io/vm-node=true:PreferNoSchedule
# The label of a VM node: the cluster's own Deployments (CoreDNS,
# snapshot-controller) stay off it by node affinity while a netns node is
# there (vm_keep_deployments_off), and the images only they run are not
# imported into it (~3 minutes of a bring-up under TCG).
VM_LABEL=berth.io/vm-node=true

# vm_keep_deployments_off: true when the cluster has VM nodes and a netns
# node that can run its Deployments instead.
vm_keep_deployments_off() {
	[ -n "$(vm_indexes)" ] && [ "$(node_indexes | wc -l)" -gt "$(vm_indexes | wc -l)" ]
}

# vm_deployment_affinity INDENT: the node affinity (YAML, each line
# indented by INDENT) that keeps a Deployment's pods off VM nodes, or
# nothing when vm_keep_deployments_off is false.
vm_deployment_affinity() {
	vm_keep_deployments_off || return 0
	sed "s/^/$1/" <<'YAML'
nodeAffinity:
  requiredDuringSchedulingIgnoredDuringExecution:
    nodeSelectorTerms:
    - matchExpressions:
      - {key: berth.io/vm-node, operator: DoesNotExist}
YAML
}

# vm_import_node_is_vm: the node images are imported into now (IMPORT_NODE)
# is a VM node.
vm_import_node_is_vm() {
	local i
	for i in $(vm_indexes); do [ "$(node_name "$i")" = "${IMPORT_NODE:-}" ] && return 0; done
	return 1
}

# vm_wait_ready I: node I Ready by its running kubelet (heartbeat after
# that kubelet's start, both by the guest's clock); longer than a netns
# node: TCG. Then the node gets VM_TAINT and VM_LABEL.
vm_wait_ready() {
	local since
	since=$(VM_EXEC_TIMEOUT=60 vm_exec "$1" stat -c %Y /run/berth-vm/kubelet.pid) || die "no kubelet in $(node_name "$1")"
	wait_for "node $(node_name "$1") Ready" 600 "qemu@$1" vm_ready_since "$(node_name "$1")" "$since"
	kctl taint node "$(node_name "$1")" "$VM_TAINT" --overwrite >/dev/null
	kctl label node "$(node_name "$1")" "$VM_LABEL" --overwrite >/dev/null
}

# vm_poweroff I: SIGKILL of qemu: the guest's kernel, page cache, mounts
# and devices end at once; the disk keeps what reached it.
vm_poweroff() {
	local i=$1 pid n
	if pid=$(pid_of "qemu@$i"); then
		log "powering off $(node_name "$i") (SIGKILL qemu $pid)"
		kill -KILL "$pid"
		for ((n = 0; n < 100; n++)); do [ -d "/proc/$pid" ] || break; sleep 0.1; done
		if [ -d "/proc/$pid" ]; then
			# Keep its pid file, so that a later down.sh stops it by PID.
			log "error: qemu $pid of $(node_name "$i") still runs 10 s after SIGKILL"
			return 1
		fi
	fi
	rm -f "$PIDS/qemu-$(node_name "$i").pid"
}

# vm_remove I: node I's qemu, tap and folder (its disk); the image stays.
vm_remove() {
	local i=$1 tap
	tap=$(node_hub_if "$i")
	vm_poweroff "$i" || true # the leftovers check reports a qemu that lives on
	if ip -n "$NETNS" link show "$tap" >/dev/null 2>&1; then
		log "deleting tap $tap"
		ip -n "$NETNS" link del "$tap"
	fi
	rm -rf --one-file-system "$(vm_dir "$i")"
}

# vm_leftovers: qemu processes, taps and disks of VM nodes still here.
vm_leftovers() {
	report "VM processes (qemu)" "$(procs_matching "$QEMU -name $NODE_PREFIX-" | grep -F "$WORKDIR" || true)"
	report "VM taps" "$(ip -n "$NETNS" -br link show type tun 2>/dev/null || true)"
	report "VM disks" "$(find "$NODES_DIR" -name disk.qcow2 2>/dev/null || true)"
	report "VM node list" "$(ls "$VM_NODES_LIST" "$VM_IMAGE_FILE" 2>/dev/null || true)"
}
