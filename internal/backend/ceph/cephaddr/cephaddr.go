//go:build ceph

// Package cephaddr reads a Ceph client's own addresses: what the blocklist
// takes to fence exactly that client. It is its own package because the
// blockdev server (one process per volume, started on every heal) needs it
// and must not link the ceph backend, which links the API types.
package cephaddr

/*
#cgo LDFLAGS: -lrados
#include <stdlib.h>
#include <rados/librados.h>
*/
import "C"

import (
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"unsafe"

	"github.com/ceph/go-ceph/rados"
)

// Client returns the addresses of conn's Ceph client instance
// ("IP:PORT/NONCE", one per messenger protocol it speaks): what Ceph's
// blocklist takes to fence exactly this client, and what the node side
// records in the Attachment's status (cephClients) when it stages a volume.
// go-ceph v0.30.0 has no wrapper for rados_getaddrs.
func Client(conn *rados.Conn) ([]string, error) {
	var out *C.char
	// rados_t is a pointer: ClusterRef carries it unchanged.
	cluster := C.rados_t(unsafe.Pointer(conn.Cluster()))
	if ret := C.rados_getaddrs(cluster, &out); ret < 0 {
		return nil, fmt.Errorf("ceph client address: %w", syscall.Errno(-ret))
	}
	defer C.free(unsafe.Pointer(out))
	return Parse(C.GoString(out))
}

// Parse turns an entity_addrvec_t's text ("1.2.3.4:0/123" or
// "[v2:1.2.3.4:0/123,v1:1.2.3.4:0/123]") into blocklist addresses, without
// the protocol prefix and without repeats.
func Parse(s string) ([]string, error) {
	s = strings.TrimSuffix(strings.TrimPrefix(strings.TrimSpace(s), "["), "]")
	var out []string
	for _, a := range strings.Split(s, ",") {
		if _, rest, ok := strings.Cut(a, ":"); ok && (strings.HasPrefix(a, "v1:") || strings.HasPrefix(a, "v2:") || strings.HasPrefix(a, "any:")) {
			a = rest
		}
		// The blocklist takes what this returns: only an address of one
		// client instance, never a word or a range (FuzzParse: "/").
		ap, nonce, ok := strings.Cut(a, "/")
		if _, err := netip.ParseAddrPort(ap); !ok || err != nil {
			return nil, fmt.Errorf("ceph client address %q: want IP:PORT/NONCE", s)
		}
		if _, err := strconv.ParseUint(nonce, 10, 32); err != nil {
			return nil, fmt.Errorf("ceph client address %q: want IP:PORT/NONCE", s)
		}
		if !slices.Contains(out, a) {
			out = append(out, a)
		}
	}
	return out, nil
}
