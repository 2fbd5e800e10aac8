// Package ceph stores volumes as RBD images in an existing Ceph pool through
// librados and librbd (go-ceph, cgo). It implements backend.Store.
//
// Everything but this file, config.go and check_stub.go is behind the
// `ceph` build tag, so that the default build needs no Ceph libraries (and
// Check says so). Build and test it with Debian's
// librbd-dev and librados-dev installed (hack/install-deps.sh librbd-dev
// librados-dev) and the tag of the Ceph release go-ceph is built against:
//
//	go build -tags ceph,pacific ./internal/backend/ceph/
//	go test -tags ceph,pacific -p 1 ./internal/backend/ceph/   # as root: starts hack/ceph
package ceph
