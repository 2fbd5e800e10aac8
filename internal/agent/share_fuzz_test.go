package agent

import (
	"net"
	"strings"
	"testing"

	"github.com/berth-io/berth/internal/share/nfsclient"
)

// FuzzNFSSource: a Volume's status.shareEndpoint becomes the source and
// options of a kernel NFS mount on this node. Whatever it holds, an
// accepted endpoint gives HOST:/EXPORT and at most a numeric port option,
// and says what nfsclient.ParseEndpoint (the share manager's and `berth
// share probe`'s reading of the same endpoint) says: the same host, port
// and export. Seeds are endpoints the share manager writes
// (sharemanager.Endpoint) and TestNFSSource's.
func FuzzNFSSource(f *testing.F) {
	for _, s := range []string{
		"nfs://share-manager-pvc-5f0c7a8e-1b2d-4c3e-9f4a-6b7c8d9e0f1a.berth-system.svc/pvc-5f0c7a8e-1b2d-4c3e-9f4a-6b7c8d9e0f1a",
		shareEndpoint, "nfs://10.0.0.7:2050/vol-a", "nfs://[fd00::7]/vol-a", "nfs://host", "nfs:///vol-a",
		"nfs://h/vol-a/../vol-b", "nfs://u@h/vol-a", "nfs://h/vol-a?x=1",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, endpoint string) {
		src, opts, err := nfsSource(endpoint)
		if err != nil {
			return
		}
		ep, perr := nfsclient.ParseEndpoint(endpoint)
		if perr != nil {
			t.Fatalf("nfsSource(%q) = %q %v, yet ParseEndpoint refuses it: %v", endpoint, src, opts, perr)
		}
		host, port, _ := net.SplitHostPort(ep.Addr)
		if strings.Contains(host, ":") {
			host = "[" + host + "]"
		}
		if want := host + ":" + ep.Export; src != want {
			t.Fatalf("nfsSource(%q) = %q, ParseEndpoint says %q", endpoint, src, want)
		}
		switch {
		case len(opts) == 0 && port == "2049":
		case len(opts) == 1 && opts[0] == "port="+port:
		default:
			t.Fatalf("nfsSource(%q) options %q, ParseEndpoint says port %s", endpoint, opts, port)
		}
	})
}
