# berth — run `make help` for the targets.
SHELL := /usr/bin/env bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

export PATH := /usr/local/go/bin:$(PATH)
BIN := $(CURDIR)/bin
CONTROLLER_GEN_VERSION := v0.19.0
GOLANGCI_LINT_VERSION := v2.11.4
HELM_VERSION := v3.19.5
CONTROLLER_GEN := $(BIN)/controller-gen-$(CONTROLLER_GEN_VERSION)
GOLANGCI_LINT := $(BIN)/golangci-lint-$(GOLANGCI_LINT_VERSION)
HELM := $(BIN)/helm-$(HELM_VERSION)

# Packages whose +kubebuilder:rbac markers make each component's roles
# (config/rbac/<component>): one role set per process, least privilege.
RBAC_operator := ./internal/controller/storagecluster/... ./internal/controller/pinned/... ./internal/controller/takeover/... ./internal/controller/sharemanager/... ./internal/cli/operator/...
RBAC_agent := ./internal/agent/... ./internal/controller ./internal/fence/... ./internal/cli/agent/...
RBAC_csi-controller := ./internal/csi/... ./internal/cli/csicontroller/...
RBAC_share-manager := ./internal/cli/sharemanager/...
RBAC_uninstall := ./internal/cli/uninstall/...
RBAC_COMPONENTS := operator agent csi-controller share-manager uninstall

VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
COMMIT ?= $(shell git rev-parse --short HEAD 2>/dev/null || echo unknown)
# -s -w: no symbol table or DWARF (stack traces keep their names and
# lines). berth and berth-flexvolume are ~100 MiB each with them; the
# image is smaller and a node pulls and unpacks it faster without.
LDFLAGS := -s -w -X github.com/berth-io/berth/internal/version.Version=$(VERSION) -X github.com/berth-io/berth/internal/version.Commit=$(COMMIT)

# Generated files that `make verify` proves current.
GENERATED := api/v1alpha1/zz_generated.deepcopy.go config/crd/bases config/rbac deploy/berth/crds deploy/berth/files deploy/manifests docs/api.md

GO_TEST_FLAGS ?=

# CEPH=1 (the default) builds berth with the ceph backend: cgo against
# Debian's librbd and librados (hack/install-deps.sh --ceph-build installs
# them), so bin/berth is dynamically linked and the image carries its
# libraries; bin/berth-flexvolume beside it is the static build without the
# backend, which the agent installs as the host's Flexvolume driver (hosts
# need no Ceph libraries). CEPH=0 builds a static berth without it: its
# operator reports CephNotBuilt for a ceph StorageCluster.
#
# netgo,osusergo: the Go resolver and user lookup, as in the static builds.
# With them a cgo build compiles every pure-Go package exactly as a static
# one does, so the Go build cache serves both (and the test clusters'
# programs, hack/modalign): a cold machine compiles client-go once.
CEPH ?= 1
CEPH_TAGS := ceph,pacific,netgo,osusergo
ifeq ($(CEPH),0)
GO_BUILD := CGO_ENABLED=0 go build
else
GO_BUILD := CGO_ENABLED=1 go build -tags $(CEPH_TAGS)
endif

##@ General

.PHONY: help
help: ## Show this help.
	@awk 'BEGIN {FS = ":.*##"; printf "Usage: make <target>\n"} /^[a-zA-Z_0-9-]+:.*?##/ { printf "  \033[36m%-12s\033[0m %s\n", $$1, $$2 } /^##@/ { printf "\n\033[1m%s\033[0m\n", substr($$0, 5) }' $(MAKEFILE_LIST)

##@ Development

.PHONY: build
build: ## Build bin/berth with version and commit, and the ceph backend (cgo; CEPH=0: static, without it).
	$(if $(filter 0,$(CEPH)),,hack/install-deps.sh --ceph-build)
	$(GO_BUILD) -trimpath -ldflags "$(LDFLAGS)" -o $(BIN)/berth ./cmd/berth
	CGO_ENABLED=0 go build -trimpath -ldflags "$(LDFLAGS)" -o $(BIN)/berth-blockdev ./cmd/berth-blockdev
	$(if $(filter 0,$(CEPH)),rm -f $(BIN)/berth-blockdev-ceph,$(GO_BUILD) -trimpath -ldflags "$(LDFLAGS)" -o $(BIN)/berth-blockdev-ceph ./cmd/berth-blockdev)
	$(if $(filter 0,$(CEPH)),rm -f $(BIN)/berth-flexvolume,CGO_ENABLED=0 go build -trimpath -ldflags "$(LDFLAGS)" -o $(BIN)/berth-flexvolume ./cmd/berth)

.PHONY: generate
generate: $(CONTROLLER_GEN) $(HELM) ## Regenerate deepcopy code, CRDs, RBAC, the chart's copies, deploy/manifests and docs/api.md.
	$(CONTROLLER_GEN) object:headerFile=hack/boilerplate.go.txt paths=./api/...
	$(CONTROLLER_GEN) crd paths=./api/... output:crd:artifacts:config=config/crd/bases
	$(foreach c,$(RBAC_COMPONENTS),$(CONTROLLER_GEN) rbac:roleName=berth-$(c) $(addprefix paths=,$(RBAC_$(c))) output:rbac:artifacts:config=config/rbac/$(c);)
	hack/chart.sh $(HELM)
	go run ./hack/apidocs -crds config/crd/bases -out docs/api.md

.PHONY: helm-lint
helm-lint: $(HELM) ## Lint the Helm chart (deploy/berth).
	$(HELM) lint --strict deploy/berth

.PHONY: helm
helm: $(HELM) ## Build the pinned helm binary into bin/.

.PHONY: helm-path
helm-path: $(HELM) ## Print the pinned helm binary's path (building it first).
	@echo $(HELM)

.PHONY: image
image: build ## Write berth's OCI image (contents: internal/image BerthSpec) to _output/berth-image.tar.
	hack/install-deps.sh e2fsprogs xfsprogs nfs-ganesha nfs-ganesha-vfs
	rm -rf _output/.image && mkdir -p _output/.image
	go run -trimpath ./hack/images -out _output/.image -pause "" -busybox "" -berth $(BIN)/berth
	mv _output/.image/berth.tar _output/berth-image.tar && rmdir _output/.image

.PHONY: image-containerfile-check
image-containerfile-check: ## Build the image from the Containerfile with buildah, offline, and check it against make image's (root).
	hack/containerfile-build.sh

.PHONY: verify
verify: ## Fail when generated files are stale or gofmt/go vet complain.
	hack/verify.sh $(MAKE) $(GENERATED)

.PHONY: lint
lint: $(GOLANGCI_LINT) ## Run golangci-lint (pinned; linters listed in .golangci.yml).
	$(GOLANGCI_LINT) run ./...

##@ Tests

.PHONY: test
test: ## Run every test: unit, envtest (real kube-apiserver + etcd), root tests.
	hack/test.sh $(GO_TEST_FLAGS)

.PHONY: sanity
sanity: ## Run csi-sanity (mount + block) and the bad-request/crash tests against the real driver (root).
	set -o pipefail; KUBEBUILDER_ASSETS=$$(hack/kube-binaries.sh | tail -n 1) go test -trimpath -count=1 -v ./test/sanity/ 2>&1 | grep -vE '^=== (RUN|PAUSE|CONT)'

FUZZTIME ?= 60s

.PHONY: fuzz
fuzz: ## Run every Go fuzz target for FUZZTIME (default 60s) each, one at a time; fails on any crash (hack/fuzz.sh).
	FUZZTIME=$(FUZZTIME) nice hack/fuzz.sh

.PHONY: bench
bench: ## fio ratios userspace/kernel loop, healed time-to-write p50/p99, PVC create -> pod Running p50/p99 on 2 nodes (root, fio).
	hack/bench.sh

.PHONY: sanity-binary
sanity-binary: ## Run the standalone csi-sanity binary against berth agent + csi-controller processes (root).
	hack/sanity.sh

.PHONY: test-unit
test-unit: ## Run unit tests only (no API server, no root).
	go test -trimpath -short $(GO_TEST_FLAGS) ./...

.PHONY: e2e
e2e: build ## Run the end-to-end scenarios on a real two-node Kubernetes with berth (root; hack/e2e.sh; BERTH_E2E_NODES).
	hack/e2e.sh $(GO_TEST_FLAGS)

.PHONY: e2e-vm
e2e-vm: build ## Run the VM scenarios (kernel NFS client, nbd, ublk, krbd, power loss) on one netns and one VM node (root; qemu).
	BERTH_E2E_NODES=1 BERTH_E2E_VM_NODES=1 BERTH_E2E_CEPH=1 hack/e2e.sh -timeout 75m -run 'TestE2E/VM' $(GO_TEST_FLAGS)

.PHONY: conformance
conformance: build ## Kubernetes External Storage tests on berth, per StorageClass (root; hack/conformance.sh; CONFORMANCE_QUICK=1 for the CI subset).
	hack/conformance.sh

.PHONY: dev-up
dev-up: build ## The main job: a local Kubernetes with berth, a PVC and a pod writing to it (root; berth dev up).
	$(BIN)/berth dev up --repo $(CURDIR)

.PHONY: dev-down
dev-down: build ## Remove everything dev-up made and check nothing is left (root; berth dev down).
	$(BIN)/berth dev down --repo $(CURDIR)

.PHONY: cluster-up
cluster-up: ## Bring up the e2e Kubernetes (hack/cluster/up.sh); writes /var/lib/berth-e2e/cluster.env.
	hack/cluster/up.sh

.PHONY: cluster-down
cluster-down: ## Stop the e2e Kubernetes and remove everything it made (hack/cluster/down.sh).
	hack/cluster/down.sh

.PHONY: ceph-up
ceph-up: ## Bring up the test Ceph (hack/ceph/up.sh: 1 mon, 1 mgr, 3 OSDs, pool berth, client.berth); prints its env file (root).
	hack/ceph/up.sh

.PHONY: ceph-down
ceph-down: ## Stop the test Ceph by PID, remove its folder and check nothing is left (hack/ceph/down.sh + leftovers.sh).
	hack/ceph/down.sh
	hack/ceph/leftovers.sh

##@ Tools (pinned, built from the Go module proxy into bin/)

$(CONTROLLER_GEN):
	GOBIN=$(BIN)/.tmp go install sigs.k8s.io/controller-tools/cmd/controller-gen@$(CONTROLLER_GEN_VERSION)
	mv $(BIN)/.tmp/controller-gen $@

$(HELM):
	GOBIN=$(BIN)/.tmp CGO_ENABLED=0 go install helm.sh/helm/v3/cmd/helm@$(HELM_VERSION)
	mv $(BIN)/.tmp/helm $@

$(GOLANGCI_LINT):
	GOBIN=$(BIN)/.tmp go install github.com/golangci/golangci-lint/v2/cmd/golangci-lint@$(GOLANGCI_LINT_VERSION)
	mv $(BIN)/.tmp/golangci-lint $@
