// Package share is the share-manager process of an RWX volume: it writes
// nfs-ganesha's configuration, runs ganesha as a child, checks the device
// and the export, and fails loudly so that the controller starts a new one.
package share

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"text/template"
	"time"
)

// PluginsDir is where Debian's nfs-ganesha keeps its FSALs; ganesha's
// built-in default is wrong there.
const PluginsDir = "/usr/lib/x86_64-linux-gnu/ganesha"

// Fast-failover defaults. A restarted server with recorded clients refuses
// new state for Grace_Period (NFSv4.1 clients that all reclaim end it
// sooner). The grace must be at least the lease: an idle client learns of
// the restart only at its next renewal, and must still reclaim in time.
// The lease is also how long a client may be slow to renew before ganesha
// expires it, and a kernel client whose lease lapsed got EIO, ENOENT and
// ESTALE on a fresh mount's first reads: Linux renews at two thirds of the
// lease, so 5 s left 1.7 s of slack, which a loaded node (the VM test node
// with its host busy) missed in 3 of 4 tries; with 15 s, 0 of 3. Ganesha's
// defaults (60 s / 90 s) make a failover last minutes.
const (
	DefaultLeaseLifetime = 15 * time.Second
	DefaultGracePeriod   = 15 * time.Second
)

// ExportConfig describes the one export a share manager serves.
type ExportConfig struct {
	// Path is the mounted volume that is exported.
	Path string
	// Pseudo is the export's path in the NFSv4 pseudo filesystem
	// ("/<volume>"), the path part of the share endpoint.
	Pseudo string
	// BindAddr and Port are where ganesha listens (0.0.0.0:2049 in a pod).
	BindAddr string
	Port     int
	// RecoveryRoot holds the fs recovery backend's client records. It must
	// outlive the process and the pod (a folder on the volume itself), so
	// that a new server knows the clients, holds a grace period and lets
	// them reclaim their state.
	RecoveryRoot string
	// LeaseLifetime and GracePeriod are the NFSv4 lease and grace.
	LeaseLifetime, GracePeriod time.Duration
	// MinorVersions are the NFSv4 minor versions served; default 1, 2:
	// sessions make reclaim exact, and with RECLAIM_COMPLETE ganesha ends
	// the grace period as soon as every known client has reclaimed.
	MinorVersions []int
	// SyncWrites makes every WRITE stable before it is answered
	// (ganesha's NFS_Commit): a client that never sends COMMIT, such as
	// the userspace client of `berth share probe`, loses nothing that was
	// acknowledged when the server dies.
	SyncWrites bool
	// PluginsDir is ganesha's FSAL folder (default PluginsDir).
	PluginsDir string
	// Clients are the addresses or CIDRs admitted, read-write; every other
	// client is refused (the export's Access_Type is None). The server's
	// own check address (LocalEndpoint's host) is always admitted.
	Clients []string
	// RootSquash maps uid 0 of clients to the anonymous user. Off, root on
	// an admitted node is root on the volume (chown, setuid files), as on
	// a local volume.
	RootSquash bool
}

func (c ExportConfig) withDefaults() ExportConfig {
	if c.BindAddr == "" {
		c.BindAddr = "0.0.0.0"
	}
	if c.Port == 0 {
		c.Port = 2049
	}
	if c.LeaseLifetime == 0 {
		c.LeaseLifetime = DefaultLeaseLifetime
	}
	if c.GracePeriod == 0 {
		c.GracePeriod = DefaultGracePeriod
	}
	if len(c.MinorVersions) == 0 {
		c.MinorVersions = []int{1, 2}
	}
	if c.PluginsDir == "" {
		c.PluginsDir = PluginsDir
	}
	return c
}

// Endpoint is the address clients dial, host:port.
func (c ExportConfig) Endpoint() string {
	c = c.withDefaults()
	return net.JoinHostPort(c.BindAddr, strconv.Itoa(c.Port))
}

// LocalEndpoint is where a process on the same host reaches the server:
// the bind address, or loopback when ganesha listens on every address.
func (c ExportConfig) LocalEndpoint() string {
	c = c.withDefaults()
	host := c.BindAddr
	if ip := net.ParseIP(host); ip == nil || ip.IsUnspecified() {
		host = "127.0.0.1"
	}
	return net.JoinHostPort(host, strconv.Itoa(c.Port))
}

// ErrInvalidConfig marks a configuration ganesha would reject or misread.
var ErrInvalidConfig = errors.New("invalid share configuration")

func (c ExportConfig) validate() error {
	var errs []error
	for name, p := range map[string]string{"export path": c.Path, "pseudo path": c.Pseudo, "recovery root": c.RecoveryRoot, "plugins dir": c.PluginsDir} {
		if !filepath.IsAbs(p) || filepath.Clean(p) != p {
			errs = append(errs, fmt.Errorf("%s %q must be a clean absolute path", name, p))
		}
		// Ganesha's config strings have no escapes.
		if strings.ContainsAny(p, "\"\n;{}#") {
			errs = append(errs, fmt.Errorf("%s %q holds a character ganesha's config cannot quote", name, p))
		}
	}
	for _, cl := range c.Clients {
		if _, err := parseClient(cl); err != nil {
			errs = append(errs, err)
		}
	}
	if c.Pseudo == "/" {
		errs = append(errs, errors.New("pseudo path must not be the pseudo root"))
	}
	if net.ParseIP(c.BindAddr) == nil {
		errs = append(errs, fmt.Errorf("bind address %q is not an IP address", c.BindAddr))
	}
	if c.Port < 1 || c.Port > 65535 {
		errs = append(errs, fmt.Errorf("port %d out of range", c.Port))
	}
	if s := c.LeaseLifetime.Seconds(); s < 1 || s > 120 || c.LeaseLifetime%time.Second != 0 {
		errs = append(errs, fmt.Errorf("lease lifetime %s: whole seconds from 1 s to 120 s", c.LeaseLifetime))
	}
	if s := c.GracePeriod.Seconds(); s < 1 || s > 180 || c.GracePeriod%time.Second != 0 {
		errs = append(errs, fmt.Errorf("grace period %s: whole seconds from 1 s to 180 s", c.GracePeriod))
	}
	if c.GracePeriod < c.LeaseLifetime {
		errs = append(errs, fmt.Errorf("grace period %s is shorter than the lease %s: idle clients would miss it", c.GracePeriod, c.LeaseLifetime))
	}
	for _, v := range c.MinorVersions {
		if v < 0 || v > 2 {
			errs = append(errs, fmt.Errorf("NFSv4 minor version %d: ganesha serves 0, 1 and 2", v))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	return nil
}

// parseClient reads one Clients entry: an IP address or a CIDR, nothing
// ganesha would look up as a host name or netgroup.
func parseClient(s string) (netip.Prefix, error) {
	if a, err := netip.ParseAddr(s); err == nil && a.Zone() == "" {
		return netip.PrefixFrom(a.Unmap(), a.Unmap().BitLen()), nil
	}
	p, err := netip.ParsePrefix(s)
	if err != nil {
		return netip.Prefix{}, fmt.Errorf("client %q is not an IP address or CIDR", s)
	}
	return p.Masked(), nil
}

// clients is the Clients list ganesha gets: c's entries and the local
// check address, each once, in a stable order so that an unchanged list
// renders the same file.
func (c ExportConfig) clients() []string {
	local, _, _ := net.SplitHostPort(c.LocalEndpoint())
	seen := map[netip.Prefix]bool{}
	var out []string
	for _, s := range append([]string{local}, c.Clients...) {
		p, err := parseClient(s)
		if err != nil || seen[p] {
			continue
		}
		seen[p] = true
		if p.IsSingleIP() {
			out = append(out, p.Addr().String())
		} else {
			out = append(out, p.String())
		}
	}
	slices.Sort(out)
	return out
}

// Render returns ganesha's configuration file for c.
func (c ExportConfig) Render() (string, error) {
	c = c.withDefaults()
	if err := c.validate(); err != nil {
		return "", err
	}
	minors := slices.Clone(c.MinorVersions)
	slices.Sort(minors)
	minors = slices.Compact(minors)
	vers := make([]string, len(minors))
	for i, v := range minors {
		vers[i] = strconv.Itoa(v)
	}
	var b strings.Builder
	err := ganeshaConf.Execute(&b, map[string]any{
		"C": c, "Minors": strings.Join(vers, ", "),
		"Lease": int(c.LeaseLifetime.Seconds()), "Grace": int(c.GracePeriod.Seconds()),
		"Clients": strings.Join(c.clients(), ", "),
	})
	return b.String(), err
}

// ganeshaConf is the whole configuration: NFSv4 over TCP only (no NLM,
// rquota, UDP or rpcbind), one VFS export. Clustered is off because one
// server serves one volume: recovery records are per volume, not per
// cluster node. Pods on different nodes share no user database, hence
// numeric owners, and no idmapd.conf: UseGetpwnam keeps ganesha off
// libnfsidmap, whose start fails without one. The export refuses every
// client (Access_Type None) but those its CLIENT block lists; the list
// changes with a SIGHUP, which rereads exports without a restart (no
// grace period).
var ganeshaConf = template.Must(template.New("ganesha.conf").Parse(`# Written by berth share-manager at every start.
NFS_CORE_PARAM {
	Protocols = 4;
	NFS_Port = {{.C.Port}};
	Bind_addr = {{.C.BindAddr}};
	Enable_NLM = false;
	Enable_RQUOTA = false;
	Enable_UDP = false;
	Clustered = false;
	Plugins_Dir = "{{.C.PluginsDir}}";
}
NFSv4 {
	Minor_Versions = {{.Minors}};
	Lease_Lifetime = {{.Lease}};
	Grace_Period = {{.Grace}};
	RecoveryBackend = fs;
	RecoveryRoot = "{{.C.RecoveryRoot}}";
	Only_Numeric_Owners = true;
	UseGetpwnam = true;
}
EXPORT {
	Export_Id = 1;
	Path = "{{.C.Path}}";
	Pseudo = "{{.C.Pseudo}}";
	Protocols = 4;
	Transports = TCP;
	Access_Type = None;
	Squash = {{if .C.RootSquash}}Root_Squash{{else}}No_Root_Squash{{end}};
	SecType = sys;
	NFS_Commit = {{.C.SyncWrites}};
	CLIENT {
		Clients = {{.Clients}};
		Protocols = 4;
		Access_Type = RW;
	}
	FSAL {
		Name = VFS;
	}
}
`))
