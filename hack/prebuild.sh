#!/usr/bin/env bash
# Builds, into berth's cache, every pinned binary that the cluster tiers
# (e2e, conformance, multus) would otherwise build at their first bring-up:
# the node and control-plane binaries, the e2e suite, the CSI sidecars and
# snapshot-controller, CoreDNS, multus and whereabouts, berth of the
# previous release (hack/cluster/release-image.sh), and, for a run with
# the VM tier, the VM nodes' kernel and root image (hack/vm/image.sh). Each
# builder skips what is cached, so a warm run costs a few file checks.
#
# `make test` in CI runs the parts in the foreground before the tiers that
# need them, and the late part beside the cluster tiers (hack/test.sh).
# Builders of one file take turns (cache_lock): a bring-up that needs a
# file the background is building waits for it. A failed build here is reported and not fatal: the bring-up builds what is
# missing and fails there if it must.
#
# PART says what to build: all (the default); vm, what the VM tier's
# cluster needs (node binaries, sidecars, CoreDNS, the VM image), so that
# tier can start as soon as those are there; suite, the storage suite
# (e2e.test, agnhost, ginkgo); late, what only the last tiers use (multus,
# whereabouts, the previous release), which CI builds beside the first
# cluster tiers; others, suite and late.
#   hack/prebuild.sh [all|vm|suite|late|others]
set -uo pipefail
cd "$(dirname "$0")/.."
export PATH="/usr/local/go/bin:$PATH"
part=${1:-all}
case $part in all | vm | suite | late | others) ;; *)
	echo "prebuild: unknown part $part (all, vm, suite, late or others)" >&2
	exit 2
	;;
esac

rc=0
step() {
	local s=$SECONDS
	if "$@" >/dev/null; then
		echo "prebuild: $* ready in $((SECONDS - s))s"
	else
		echo "prebuild: $* failed after $((SECONDS - s))s (the bring-up will try again)"
		rc=1
	fi
}
start=$SECONDS
if [ "$part" = all ] || [ "$part" = vm ]; then
	step hack/kube-binaries.sh kube-controller-manager kube-scheduler kubelet kube-proxy kubectl
	step hack/csi-sidecars.sh csi-provisioner csi-resizer csi-snapshotter snapshot-controller
	step hack/coredns.sh
	# The VM image for the VM tier (hack/test.sh sets BERTH_E2E_VM_CI).
	if [ "$part" = vm ] || [ "${BERTH_E2E_VM_CI:-0}" = 1 ]; then step hack/vm/image.sh; fi
fi
if [ "$part" = all ] || [ "$part" = others ] || [ "$part" = suite ]; then
	step hack/kube-binaries.sh e2e.test agnhost ginkgo
fi
if [ "$part" = all ] || [ "$part" = others ] || [ "$part" = late ]; then
	step hack/cni-plugins.sh multus whereabouts
	# The previous release, which the e2e upgrade scenario starts from: only
	# when that scenario runs (BERTH_E2E_UPGRADE=0 leaves it out), as a cold
	# build of it costs minutes of CPU the other tiers need.
	if [ "${BERTH_E2E_UPGRADE:-1}" != 0 ]; then step hack/cluster/release-image.sh; fi
fi
echo "prebuild: done in $((SECONDS - start))s"
exit "$rc"
