// Package nfsclient is berth's userspace NFSv4 client, for machines and
// pods without a kernel NFS client: `berth share probe` and the share
// manager's export check. It wraps github.com/aurorasolar/go-nfs-client,
// which has no reconnect of its own, with reconnect-and-retry, so that a
// caller rides a server failover.
package nfsclient

import (
	"fmt"
	"net"
	"net/url"
	"path"
	"strings"
)

// Endpoint is a share endpoint, nfs://host[:port]/export.
type Endpoint struct {
	// Addr is host:port (port 2049 when the URL has none).
	Addr string
	// Export is the export's path in the server's pseudo filesystem.
	Export string
}

func (e Endpoint) String() string { return "nfs://" + e.Addr + e.Export }

// ParseEndpoint parses nfs://host[:port]/export.
func ParseEndpoint(s string) (Endpoint, error) {
	u, err := url.Parse(s)
	if err != nil {
		return Endpoint{}, fmt.Errorf("endpoint %q: %w", s, err)
	}
	if u.Scheme != "nfs" {
		return Endpoint{}, fmt.Errorf("endpoint %q: scheme must be nfs", s)
	}
	if u.Host == "" || u.Hostname() == "" {
		return Endpoint{}, fmt.Errorf("endpoint %q: no host", s)
	}
	if u.User != nil || u.RawQuery != "" || u.Fragment != "" {
		return Endpoint{}, fmt.Errorf("endpoint %q: only nfs://host[:port]/export", s)
	}
	port := u.Port()
	if port == "" {
		port = "2049"
	}
	export := path.Clean("/" + u.Path)
	if export == "/" || strings.Contains(u.Path, "..") {
		return Endpoint{}, fmt.Errorf("endpoint %q: needs an export path", s)
	}
	return Endpoint{Addr: net.JoinHostPort(u.Hostname(), port), Export: export}, nil
}

// path returns name inside the export; name must be a relative path.
func (e Endpoint) path(name string) (string, error) {
	clean := path.Clean(name)
	if name == "" || path.IsAbs(name) || clean == "." || clean == ".." || strings.HasPrefix(clean, "../") {
		return "", fmt.Errorf("file name %q: must be a relative path inside the export", name)
	}
	return e.Export + "/" + clean, nil
}
