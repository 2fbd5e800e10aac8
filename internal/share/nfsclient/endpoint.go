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
	"regexp"
	"strconv"
	"strings"
	"unicode"
)

// Endpoint is a share endpoint, nfs://host[:port]/export.
type Endpoint struct {
	// Addr is host:port (port 2049 when the URL has none).
	Addr string
	// Export is the export's path in the server's pseudo filesystem.
	Export string
}

func (e Endpoint) String() string {
	return (&url.URL{Scheme: "nfs", Host: e.Addr, Path: e.Export}).String()
}

// hostName is a DNS name (letters, digits, dashes, dots).
var hostName = regexp.MustCompile(`^[A-Za-z0-9]([-A-Za-z0-9.]*[A-Za-z0-9])?$`)

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
	// url.Parse takes hosts such as ":" (from "nfs://::/x") and "]"
	// (FuzzParseEndpoint): only a DNS name or an IP address is one.
	if h := u.Hostname(); net.ParseIP(h) == nil && !hostName.MatchString(h) {
		return Endpoint{}, fmt.Errorf("endpoint %q: host %q is neither a name nor an address", s, h)
	}
	if u.User != nil || u.RawQuery != "" || u.Fragment != "" {
		return Endpoint{}, fmt.Errorf("endpoint %q: only nfs://host[:port]/export", s)
	}
	port := u.Port()
	if port == "" {
		port = "2049"
	}
	// url.Parse takes any digits for a port (FuzzParseEndpoint: "0").
	if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 || strconv.Itoa(n) != port {
		return Endpoint{}, fmt.Errorf("endpoint %q: port must be 1-65535", s)
	}
	export := path.Clean("/" + u.Path)
	if export == "/" || strings.Contains(u.Path, "..") {
		return Endpoint{}, fmt.Errorf("endpoint %q: needs an export path", s)
	}
	// An escaped control character (%00) is no export name, and a mount
	// source or log line must not carry one.
	if strings.IndexFunc(export, unicode.IsControl) >= 0 {
		return Endpoint{}, fmt.Errorf("endpoint %q: control character in the export path", s)
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
