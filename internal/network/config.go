package network

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"strings"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// A copy is marked twice: its name starts with copyPrefix and its alias
// names its holder. Both must agree before the mover removes an interface.
const (
	copyPrefix  = "bmv"
	aliasPrefix = "berth.io/mover "
	// stateCopying marks a copy being made; one found in that state outside
	// the mover's copy step is a leftover of a killed mover, and is removed.
	stateCopying = "copying"
	stateCopied  = "copied"
)

// CopyName is the host interface name of a holder's copy (15 characters,
// the kernel's limit).
func CopyName(podUID string) string {
	sum := sha256.Sum256([]byte(podUID))
	return copyPrefix + hex.EncodeToString(sum[:])[:12]
}

func copyAlias(state string, r Record) string {
	return fmt.Sprintf("%s%s holder=%s interface=%s", aliasPrefix, state, r.PodUID, r.Interface)
}

// mark is what a copy's alias says.
type mark struct {
	state, podUID, iface string
}

// ownedCopy returns the mark of an interface this mover made, and false
// for every other interface.
func ownedCopy(l Link) (mark, bool) {
	rest, ok := strings.CutPrefix(l.Alias, aliasPrefix)
	if !ok || !strings.HasPrefix(l.Name, copyPrefix) {
		return mark{}, false
	}
	var m mark
	if n, err := fmt.Sscanf(rest, "%s holder=%s interface=%s", &m.state, &m.podUID, &m.iface); n != 3 || err != nil {
		return mark{}, false
	}
	if CopyName(m.podUID) != l.Name {
		return mark{}, false
	}
	return m, true
}

// ipConfig is an interface's IP configuration as the mover copies it.
type ipConfig struct {
	addrs  []netlink.Addr
	routes []netlink.Route
}

// readConfig reads what is configured on an interface, leaving out what the
// kernel derives by itself on any interface (IPv6 link-local addresses from
// the MAC, prefix routes from the addresses): adding those again fails.
func readConfig(s Stack, name string) (ipConfig, error) {
	var c ipConfig
	addrs, err := s.Addrs(name)
	if err != nil {
		return c, err
	}
	for _, a := range addrs {
		if a.IPNet == nil || (a.IP.To4() == nil && a.IP.IsLinkLocalUnicast()) {
			continue
		}
		out := netlink.Addr{IPNet: a.IPNet, Peer: a.Peer, Broadcast: a.Broadcast, Scope: a.Scope}
		if a.IP.To4() == nil {
			// Duplicate detection ran on the original; the copy takes its place.
			out.Flags = unix.IFA_F_NODAD
		}
		c.addrs = append(c.addrs, out)
	}
	routes, err := s.Routes(name)
	if err != nil {
		return c, err
	}
	for _, r := range routes {
		if r.Protocol == unix.RTPROT_KERNEL || len(r.MultiPath) > 0 || (r.Type != 0 && r.Type != unix.RTN_UNICAST) {
			continue
		}
		r.LinkIndex, r.ILinkIndex = 0, 0
		// Keep only onlink: linkdown and the like describe the old interface.
		r.Flags &= unix.RTNH_F_ONLINK
		c.routes = append(c.routes, r)
	}
	return c, nil
}

func isDefault(r netlink.Route) bool {
	if r.Dst == nil {
		return true
	}
	ones, _ := r.Dst.Mask.Size()
	return ones == 0
}

// hostRoutes are the routes a copy gets: never a default route, which
// would take the host's own traffic onto the storage network.
func hostRoutes(c ipConfig) (keep, skipped []netlink.Route) {
	for _, r := range c.routes {
		if isDefault(r) {
			skipped = append(skipped, r)
			continue
		}
		keep = append(keep, r)
	}
	return keep, skipped
}

// apply adds c to an interface. With tolerant, what exists already is no
// error (restoring an original whose IPv4 addresses survived going down).
func apply(s Stack, name string, addrs []netlink.Addr, routes []netlink.Route, tolerant bool) error {
	var errs []error
	for _, a := range addrs {
		if err := s.AddAddr(name, a); err != nil && !(tolerant && errors.Is(err, unix.EEXIST)) {
			if !tolerant {
				return err
			}
			errs = append(errs, err)
		}
	}
	for _, r := range routes {
		if err := s.AddRoute(name, r); err != nil && !(tolerant && errors.Is(err, unix.EEXIST)) {
			if !tolerant {
				return err
			}
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func macEqual(a, b net.HardwareAddr) bool { return a.String() == b.String() }

// IsCopyName tells whether name is one CopyName makes.
func IsCopyName(name string) bool {
	return strings.HasPrefix(name, copyPrefix) && len(name) == len(copyPrefix)+12
}
