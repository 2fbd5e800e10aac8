package agent

import (
	"strconv"
	"strings"
	"testing"
)

// FuzzNFSSource: a Volume's status.shareEndpoint becomes the source and
// options of a kernel NFS mount on this node. Whatever it holds, an
// accepted endpoint gives what mount.nfs reads as one server and export
// (an argument of its own, so spaces and commas in it are the export's):
// HOST:/EXPORT, a host that is a name or a bracketed IPv6 address, an
// export with no "." or ".." component, and at most one option, port=N with N a port other than
// NFS's own 2049. Seeds are endpoints the share manager writes
// (sharemanager.Endpoint) and TestNFSSource's.
func FuzzNFSSource(f *testing.F) {
	for _, s := range []string{
		"nfs://share-manager-pvc-5f0c7a8e-1b2d-4c3e-9f4a-6b7c8d9e0f1a.berth-system.svc/pvc-5f0c7a8e-1b2d-4c3e-9f4a-6b7c8d9e0f1a",
		shareEndpoint, "nfs://10.0.0.7:2050/vol-a", "nfs://[fd00::7]/vol-a", "nfs://host", "nfs:///vol-a",
		"nfs://h/vol-a/../vol-b", "nfs://u@h/vol-a", "nfs://h/vol-a?x=1", "nfs://h:0/v", "nfs://h:2049/v", "nfs://h/a,b",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, endpoint string) {
		src, opts, err := nfsSource(endpoint)
		if err != nil {
			return
		}
		host, export, ok := strings.Cut(src, ":/")
		if strings.HasPrefix(host, "[") {
			// [v6]:/export: the address holds colons of its own.
			h, rest, found := strings.Cut(src, "]:/")
			host, export, ok = h+"]", rest, found && !strings.Contains(h[1:], "]")
		}
		if !ok || host == "" || (strings.Contains(host, ":") && !strings.HasPrefix(host, "[")) {
			t.Fatalf("nfsSource(%q) = %q: not HOST:/EXPORT", endpoint, src)
		}
		for _, c := range strings.Split(export, "/") {
			if c == "." || c == ".." {
				t.Fatalf("nfsSource(%q) = %q: export component %q", endpoint, src, c)
			}
		}
		if len(opts) > 1 {
			t.Fatalf("nfsSource(%q) options %q: more than a port", endpoint, opts)
		}
		for _, o := range opts {
			n, err := strconv.Atoi(strings.TrimPrefix(o, "port="))
			if !strings.HasPrefix(o, "port=") || err != nil || n < 1 || n > 65535 || n == 2049 || "port="+strconv.Itoa(n) != o {
				t.Fatalf("nfsSource(%q) option %q: not port=N of another port than 2049", endpoint, o)
			}
		}
	})
}
