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

# build_module_command NAME MODULE VERSION CMD-DIR BIN LDFLAGS [PREPARE]
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
	(cd "$work/$name" && CGO_ENABLED=0 GOFLAGS=-mod=mod go build -trimpath -ldflags "$ldflags" -o "$bin.tmp" "$cmd")
	mv "$bin.tmp" "$bin"
	cache_unlock
	log "$name $version ready in $((SECONDS - start))s"
}
