package nfsclient

import (
	"net"
	"path"
	"strconv"
	"strings"
	"testing"
)

// FuzzParseEndpoint: a share endpoint comes from a Volume's status or a
// user's `berth share probe` argument. An accepted one has a host, a port
// in 1-65535 and a clean absolute export other than / with no "..", and
// its String() reads back to the same Endpoint. Seeds are endpoints the
// share manager writes and TestParseEndpoint's.
func FuzzParseEndpoint(f *testing.F) {
	for _, s := range []string{
		"nfs://share-manager-pvc-5f0c7a8e-1b2d-4c3e-9f4a-6b7c8d9e0f1a.berth-system.svc/pvc-5f0c7a8e-1b2d-4c3e-9f4a-6b7c8d9e0f1a",
		"nfs://10.0.0.5/pv1", "nfs://share-pv1:20490/pv1/", "nfs://[fd00::1]:2049/a/b", "nfs://h/../x", "nfs://u@h/x",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		ep, err := ParseEndpoint(s)
		if err != nil {
			return
		}
		host, port, err := net.SplitHostPort(ep.Addr)
		if err != nil || host == "" {
			t.Fatalf("ParseEndpoint(%q) = %+v: address without a host", s, ep)
		}
		if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 || strconv.Itoa(n) != port {
			t.Fatalf("ParseEndpoint(%q) = %+v: port %q", s, ep, port)
		}
		if ep.Export == "/" || path.Clean(ep.Export) != ep.Export || !path.IsAbs(ep.Export) || strings.Contains(ep.Export, "..") {
			t.Fatalf("ParseEndpoint(%q) = %+v: export is not a clean path below /", s, ep)
		}
		if again, err := ParseEndpoint(ep.String()); err != nil || again != ep {
			t.Fatalf("ParseEndpoint(%q) = %+v; its String %q reads back as %+v, %v", s, ep, ep.String(), again, err)
		}
	})
}
