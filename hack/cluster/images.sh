# Images of the e2e cluster, built locally and imported into containerd
# (sourced by up.sh; ctr_ is the node's ctr, IMPORT_NODE its name).
# Tarballs are rebuilt only when their inputs changed.

PAUSE_IMAGE=registry.k8s.io/pause:3.10
BUSYBOX_IMAGE=berth.local/busybox:e2e
BERTH_IMAGE_TAG=
# CSI sidecars (hack/csi-sidecars.sh), imported when BERTH_E2E_SIDECARS=1.
SIDECAR_IMAGES=()
# The Kubernetes e2e suite's images (hack/conformance.sh), imported when
# BERTH_E2E_CONFORMANCE_IMAGES=1. Registry berth.local/e2e-test-images (the
# suite's KUBE_TEST_REPO_LIST points there), names and versions of
# k8s.io/kubernetes v1.34.4 test/utils/image/manifest.go. agnhost is built
# from that module; the others are busybox stand-ins: the storage suites
# run only sh, dd, sha256sum, ls and sleep in them.
E2E_IMAGE_REGISTRY=berth.local/e2e-test-images
E2E_AGNHOST_IMAGE=$E2E_IMAGE_REGISTRY/agnhost:2.56
E2E_BUSYBOX_STANDINS=("$E2E_IMAGE_REGISTRY/busybox:1.37.0-1" "$E2E_IMAGE_REGISTRY/nginx:1.14-4" "$E2E_IMAGE_REGISTRY/jessie-dnsutils:1.7")
# NAME=TAG=BIN: more one-binary images to build and import (dns.sh: CoreDNS).
BINARY_IMAGES=()

# stale OUT INPUT...: true when OUT is missing or older than an input.
stale() {
	local out=$1
	shift
	[ -e "$out" ] || return 0
	[ -n "$(find "$@" -newer "$out" -print -quit 2>/dev/null)" ]
}

build_and_import_images() {
	local tool="$WORKDIR/bin/images" pause="$WORKDIR/bin/pause"
	local srcs=("$REPO/hack/images" "$REPO/internal/image" "$REPO/go.mod")
	# The tool lives in the shared work dir; a checkout with other sources
	# (another worktree, an older commit) may have built it, whatever the
	# times say: rebuild when the sources' content differs.
	local sum
	sum=$(find "${srcs[@]}" -type f -name '*.go' -o -name go.mod | LC_ALL=C sort | xargs sha256sum | sha256sum | cut -d' ' -f1)
	if stale "$tool" "${srcs[@]}" || stale "$pause" "${srcs[@]}" || [ "$(cat "$tool.sum" 2>/dev/null)" != "$sum" ]; then
		log "building the image tool and the pause binary"
		(cd "$REPO" && ticking "building the image tool" sh -c \
			"CGO_ENABLED=0 go build -trimpath -o '$pause' ./hack/images/pause && CGO_ENABLED=0 go build -trimpath -o '$tool' ./hack/images")
		echo "$sum" >"$tool.sum"
	fi
	# -busybox defaults to /bin/busybox in the tool: "" skips a fresh one.
	local args=(-busybox "") need=
	stale "$IMAGES/pause.tar" "$pause" && args+=(-pause "$pause") need=1
	stale "$IMAGES/busybox.tar" /bin/busybox "$tool" && args+=(-busybox /bin/busybox) need=1
	if [ -n "${BERTH_E2E_BERTH_BINARY:-}" ]; then
		[ -x "$BERTH_E2E_BERTH_BINARY" ] || die "BERTH_E2E_BERTH_BINARY=$BERTH_E2E_BERTH_BINARY is not an executable"
		BERTH_IMAGE_TAG=berth.local/berth:dev
		# The berth image carries the node's mkfs/resize tools and ganesha
		# (internal/image BerthSpec): on a fresh machine they come first.
		"$REPO/hack/install-deps.sh" e2fsprogs xfsprogs nfs-ganesha nfs-ganesha-vfs
		# Extra programs for the berth image, e.g. BERTH_E2E_BERTH_EXTRA_TOOLS=fio.
		args+=(-berth-extra-tools "${BERTH_E2E_BERTH_EXTRA_TOOLS:-}")
		stale "$IMAGES/berth.tar" "$BERTH_E2E_BERTH_BINARY" "$tool" && args+=(-berth "$BERTH_E2E_BERTH_BINARY") need=1
	fi
	if [ "${BERTH_E2E_SIDECARS:-}" = 1 ]; then
		local dir name version
		dir=$(ticking "building CSI sidecars" "$REPO/hack/csi-sidecars.sh" | tail -n1)
		for bin in "$dir"/csi-provisioner-"${PROVISIONER_VERSION:-v5.3.0}" \
			"$dir"/csi-resizer-"${RESIZER_VERSION:-v1.14.0}" "$dir"/csi-snapshotter-"${SNAPSHOTTER_VERSION:-v8.3.0}"; do
			name=$(basename "$bin") version=${bin##*-} name=${name%-*}
			# Called once per node: list each image once.
			grep -qxF "berth.local/$name:$version=$IMAGES/$name.tar" < <(printf '%s\n' "${SIDECAR_IMAGES[@]}") ||
				SIDECAR_IMAGES+=("berth.local/$name:$version=$IMAGES/$name.tar")
			stale "$IMAGES/$name.tar" "$bin" "$tool" && args+=(-binary "$name=berth.local/$name:$version=$bin") need=1
		done
	fi
	if [ "${BERTH_E2E_CONFORMANCE_IMAGES:-}" = 1 ]; then
		local agnhost
		agnhost="$(ticking "building agnhost" "$REPO/hack/kube-binaries.sh" agnhost | tail -n1)/agnhost"
		stale "$IMAGES/agnhost.tar" "$agnhost" /bin/busybox "$tool" &&
			args+=(-agnhost "$agnhost" -agnhost-tag "$E2E_AGNHOST_IMAGE") need=1
	fi
	local spec name tag bin
	for spec in "${BINARY_IMAGES[@]}"; do
		# TAG holds a ':' but never a '='.
		IFS='=' read -r name tag bin <<<"$spec"
		grep -qxF "$tag=$IMAGES/$name.tar" < <(printf '%s\n' "${SIDECAR_IMAGES[@]}") || SIDECAR_IMAGES+=("$tag=$IMAGES/$name.tar")
		stale "$IMAGES/$name.tar" "$bin" "$tool" && args+=(-binary "$spec") need=1
	done
	if [ -n "$need" ]; then
		log "writing image tarballs to $IMAGES"
		"$tool" -out "$IMAGES" "${args[@]}"
	fi

	local have
	have=$(ctr_ images ls -q)
	import() {
		local tag=$1 tar=$2
		# A rebuilt tarball replaces the image: ctr import moves the tag.
		local mark="$tar.imported${IMPORT_NODE:+.$IMPORT_NODE}"
		if grep -qxF "$tag" <<<"$have" && ! stale "$mark" "$tar"; then
			return 0
		fi
		log "importing $tag${IMPORT_NODE:+ into $IMPORT_NODE}"
		ctr_ images import --platform linux/amd64 "$tar" >/dev/null
		touch "$mark"
	}
	import "$PAUSE_IMAGE" "$IMAGES/pause.tar"
	import "$BUSYBOX_IMAGE" "$IMAGES/busybox.tar"
	[ -z "$BERTH_IMAGE_TAG" ] || import "$BERTH_IMAGE_TAG" "$IMAGES/berth.tar"
	local s
	# The sidecars and CoreDNS run in Deployments only, which a VM node
	# does not get while a netns node is there (vm.sh).
	if declare -F vm_import_node_is_vm >/dev/null && vm_import_node_is_vm && vm_keep_deployments_off; then
		log "not importing ${#SIDECAR_IMAGES[@]} Deployment images into VM node $IMPORT_NODE: those pods run on netns nodes"
	else
		for s in "${SIDECAR_IMAGES[@]}"; do import "${s%%=*}" "${s#*=}"; done
	fi
	if [ "${BERTH_E2E_CONFORMANCE_IMAGES:-}" = 1 ]; then
		import "$E2E_AGNHOST_IMAGE" "$IMAGES/agnhost.tar"
		ctr_ images tag --force "$BUSYBOX_IMAGE" "${E2E_BUSYBOX_STANDINS[@]}" >/dev/null
	fi
}
