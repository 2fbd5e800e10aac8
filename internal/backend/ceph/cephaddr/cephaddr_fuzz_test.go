//go:build ceph

package cephaddr

import (
	"net/netip"
	"strconv"
	"strings"
	"testing"
)

// FuzzParse: a Ceph client's address text becomes the addresses that the
// blocklist takes and the Attachment's status records. Whatever the
// text, Parse returns at least one address, each IP:PORT/NONCE with a
// numeric nonce, without the protocol prefix, each once. Seeds are
// librados' own answers (TestParse's, taken from rados_getaddrs on the
// test Ceph).
func FuzzParse(f *testing.F) {
	for _, s := range []string{
		"127.0.0.1:0/3701837422", "[v2:10.0.0.1:0/42,v1:10.0.0.1:0/42]", "[v2:[fd00::1]:0/7,v1:[fd00::1]:0/7]",
		"[any:10.0.0.2:0/9]", "[v2:10.0.0.1:6800/1,v1:10.0.0.1:6801/1]",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		addrs, err := Parse(s)
		if err != nil {
			return
		}
		if len(addrs) == 0 {
			t.Fatalf("Parse(%q): no address and no error", s)
		}
		seen := map[string]bool{}
		for _, a := range addrs {
			ap, nonce, ok := strings.Cut(a, "/")
			if _, err := netip.ParseAddrPort(ap); !ok || err != nil {
				t.Fatalf("Parse(%q) = %q: %q is not IP:PORT/NONCE", s, addrs, a)
			}
			if _, err := strconv.ParseUint(nonce, 10, 32); err != nil {
				t.Fatalf("Parse(%q) = %q: nonce of %q", s, addrs, a)
			}
			if seen[a] {
				t.Fatalf("Parse(%q) = %q: %q twice", s, addrs, a)
			}
			seen[a] = true
		}
	})
}
