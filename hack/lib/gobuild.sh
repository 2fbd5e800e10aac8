# Building pinned Go programs from source into berth's cache (sourced, not
# run, by hack/kube-binaries.sh, csi-sidecars.sh, cni-plugins.sh and
# coredns.sh). No registry or release download is reachable on our machines,
# so each tool is built from the Go module proxy once and kept under a name
# that carries its version: a second run only checks that the file exists.
# The sourcing script defines log().

CACHE_ROOT="${BERTH_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/berth}"

# need_go exits unless go is on PATH.
need_go() {
	command -v go >/dev/null || { log "go is required (expected at /usr/local/go/bin)"; exit 1; }
}

# scratch sets $work to a scratch folder, made on the first call and removed
# when the script exits (downloaded modules are read-only, hence the chmod).
work=
scratch() {
	[ -z "$work" ] || return 0
	work=$(mktemp -d)
	trap 'chmod -R u+w "$work" 2>/dev/null; rm -rf "$work"' EXIT
}

# cache_lock FILE: holds FILE.lock (until cache_unlock or the script's
# exit), so that two builds of one cached file (CI's background prebuild
# and a bring-up that needs the file now) never write it at once: the
# second waits, then finds it built. Call it, then check the cache again.
# One lock at a time: two builders never wait on each other in a circle.
cache_lock_fd=
cache_lock() {
	cache_unlock
	mkdir -p "$(dirname "$1")"
	exec {cache_lock_fd}>"$1.lock"
	if ! flock -n "$cache_lock_fd"; then
		log "waiting for another build of $(basename "$1")"
		flock "$cache_lock_fd"
	fi
}

# cache_unlock lets the lock of cache_lock go.
cache_unlock() {
	[ -z "$cache_lock_fd" ] || exec {cache_lock_fd}>&-
	cache_lock_fd=
}

# The repository this file belongs to (hack/lib/gobuild.sh).
BERTH_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)

# align_with_berth [KEEP-REGEX]: in the Go module of the current folder,
# raises every requirement that berth's go.mod also selects to berth's
# version where berth's is higher (hack/modalign). On a cold
# machine, client-go, grpc and golang.org/x then compile once for berth and
# every program built here, not once per program (~170 s of both cores per
# client-go). Modules matching KEEP-REGEX keep their own versions.
# BERTH_ALIGN=0 builds each program at its release's own versions.
align_with_berth() {
	[ "${BERTH_ALIGN:-1}" != 0 ] || return 0
	scratch
	if [ ! -x "$work/modalign" ]; then
		(cd "$BERTH_ROOT" && CGO_ENABLED=0 go build -trimpath -o "$work/modalign" ./hack/modalign)
	fi
	local round
	# Raised modules can bring in more shared ones: a second round. No go
	# mod tidy: it resolves every package of the module, tests included
	# (csi-provisioner's e2e tests import k8s.io/kubernetes); the build's
	# -mod=mod adds what the program itself needs.
	for round in 1 2; do
		"$work/modalign" -berth "$BERTH_ROOT" ${1:+-keep "$1"} || return 1
	done
}

# build_module_command NAME MODULE VERSION CMD-DIR BIN LDFLAGS [PREPARE]
# (ALIGN_KEEP: the modules, a regular expression, that align_with_berth
# leaves at the program's own versions)
# builds the command CMD-DIR of MODULE@VERSION as the static binary BIN,
# unless BIN is there. It is built in a writable copy of the downloaded
# module with the module's own go.mod and go.sum (the dependency versions it
# was released with); PREPARE, a function, first runs in that copy.
build_module_command() {
	local name=$1 mod=$2 version=$3 cmd=$4 bin=$5 ldflags=$6 prepare=${7:-} dir start=$SECONDS
	if [ -x "$bin" ]; then
		log "cached: $bin"
		return 0
	fi
	cache_lock "$bin"
	if [ -x "$bin" ]; then
		log "built meanwhile: $bin"
		cache_unlock
		return 0
	fi
	need_go
	scratch
	log "building $name $version from $mod (first time only, a few minutes)"
	dir=$(cd "$work" && GOFLAGS=-mod=mod go mod download -json "$mod@$version" | sed -n 's/.*"Dir": "\(.*\)".*/\1/p')
	[ -n "$dir" ] || { log "could not download $mod@$version"; exit 1; }
	cp -r "$dir" "$work/$name"
	chmod -R u+w "$work/$name"
	if [ -n "$prepare" ]; then (cd "$work/$name" && "$prepare"); fi
	build_here() { (cd "$work/$name" && CGO_ENABLED=0 GOFLAGS=-mod=mod go build -trimpath -ldflags "$ldflags" -o "$bin.tmp" "$cmd"); }
	cp "$work/$name/go.mod" "$work/$name.go.mod"
	cp "$work/$name/go.sum" "$work/$name.go.sum" 2>/dev/null || : >"$work/$name.go.sum"
	if ! (cd "$work/$name" && align_with_berth "${ALIGN_KEEP:-}") || ! build_here; then
		[ "${BERTH_ALIGN:-1}" != 0 ] || exit 1
		log "$name $version does not build at berth's module versions: building it at its own"
		cp "$work/$name.go.mod" "$work/$name/go.mod"
		cp "$work/$name.go.sum" "$work/$name/go.sum"
		build_here
	fi
	mv "$bin.tmp" "$bin"
	cache_unlock
	log "$name $version ready in $((SECONDS - start))s"
}
