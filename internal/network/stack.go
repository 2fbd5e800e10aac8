package network

import (
	"errors"
	"fmt"
	"net"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// ErrNoLink is returned for an interface that does not exist.
var ErrNoLink = errors.New("no such interface")

// Link is what the mover needs to know of an interface.
type Link struct {
	Name  string
	Index int
	// Kind is the rtnetlink kind: "macvlan", "veth", "bridge", ...
	Kind string
	MAC  net.HardwareAddr
	MTU  int
	// ParentIndex is the macvlan's parent (lower) interface, an index in the
	// namespace the macvlan was created in.
	ParentIndex int
	Mode        netlink.MacvlanMode
	Alias       string
	Up          bool
}

// Stack is rtnetlink in one network namespace: the mover's only way to the
// kernel's interfaces, addresses and routes.
type Stack interface {
	Link(name string) (Link, error)
	Links() ([]Link, error)
	// AddMacvlan creates l as a macvlan, down, with l's name, parent, mode,
	// MAC, MTU and alias in one request, so that it never exists unmarked.
	AddMacvlan(l Link) error
	DeleteLink(name string) error
	SetUp(name string, up bool) error
	SetAlias(name, alias string) error
	Addrs(name string) ([]netlink.Addr, error)
	AddAddr(name string, a netlink.Addr) error
	// Routes lists the routes of the main table through the interface.
	Routes(name string) ([]netlink.Route, error)
	AddRoute(name string, r netlink.Route) error
	Close()
}

// NetlinkStack is a Stack on a netlink handle.
type NetlinkStack struct {
	h *netlink.Handle
}

// OpenStack opens rtnetlink in ns; netns.None() is this thread's namespace.
func OpenStack(ns netns.NsHandle) (*NetlinkStack, error) {
	var h *netlink.Handle
	var err error
	if ns.IsOpen() {
		h, err = netlink.NewHandleAt(ns, unix.NETLINK_ROUTE)
	} else {
		h, err = netlink.NewHandle(unix.NETLINK_ROUTE)
	}
	if err != nil {
		return nil, fmt.Errorf("rtnetlink: %w", err)
	}
	return &NetlinkStack{h: h}, nil
}

// OpenOwnStack opens rtnetlink in the calling thread's namespace.
func OpenOwnStack() (*NetlinkStack, error) { return OpenStack(netns.None()) }

// Close closes the netlink socket, the stack's hold on its namespace.
func (s *NetlinkStack) Close() { s.h.Close() }

func (s *NetlinkStack) link(name string) (netlink.Link, error) {
	l, err := s.h.LinkByName(name)
	var nf netlink.LinkNotFoundError
	if errors.As(err, &nf) {
		return nil, fmt.Errorf("%s: %w", name, ErrNoLink)
	}
	if err != nil {
		return nil, fmt.Errorf("interface %s: %w", name, err)
	}
	return l, nil
}

func toLink(l netlink.Link) Link {
	a := l.Attrs()
	out := Link{
		Name: a.Name, Index: a.Index, Kind: l.Type(), MAC: a.HardwareAddr, MTU: a.MTU,
		ParentIndex: a.ParentIndex, Alias: a.Alias, Up: a.Flags&net.FlagUp != 0,
	}
	if m, ok := l.(*netlink.Macvlan); ok {
		out.Mode = m.Mode
	}
	return out
}

// Link returns the named interface, or an error wrapping ErrNoLink.
func (s *NetlinkStack) Link(name string) (Link, error) {
	l, err := s.link(name)
	if err != nil {
		return Link{}, err
	}
	return toLink(l), nil
}

// Links lists the namespace's interfaces.
func (s *NetlinkStack) Links() ([]Link, error) {
	ls, err := s.h.LinkList()
	if err != nil {
		return nil, fmt.Errorf("list interfaces: %w", err)
	}
	out := make([]Link, 0, len(ls))
	for _, l := range ls {
		out = append(out, toLink(l))
	}
	return out, nil
}

// AddMacvlan creates the macvlan l describes, down.
func (s *NetlinkStack) AddMacvlan(l Link) error {
	m := &netlink.Macvlan{Mode: l.Mode}
	m.Name, m.ParentIndex, m.HardwareAddr, m.MTU, m.Alias = l.Name, l.ParentIndex, l.MAC, l.MTU, l.Alias
	if err := s.h.LinkAdd(m); err != nil {
		return fmt.Errorf("create macvlan %s on interface %d: %w", l.Name, l.ParentIndex, err)
	}
	return nil
}

// DeleteLink deletes the named interface; a missing one wraps ErrNoLink.
func (s *NetlinkStack) DeleteLink(name string) error {
	l, err := s.link(name)
	if err != nil {
		return err
	}
	if err := s.h.LinkDel(l); err != nil {
		return fmt.Errorf("delete interface %s: %w", name, err)
	}
	return nil
}

// SetUp sets the interface up or down.
func (s *NetlinkStack) SetUp(name string, up bool) error {
	l, err := s.link(name)
	if err != nil {
		return err
	}
	if up {
		err = s.h.LinkSetUp(l)
	} else {
		err = s.h.LinkSetDown(l)
	}
	if err != nil {
		return fmt.Errorf("set interface %s up=%v: %w", name, up, err)
	}
	return nil
}

// SetAlias sets the interface's alias (ifalias).
func (s *NetlinkStack) SetAlias(name, alias string) error {
	l, err := s.link(name)
	if err != nil {
		return err
	}
	if err := s.h.LinkSetAlias(l, alias); err != nil {
		return fmt.Errorf("set alias of %s: %w", name, err)
	}
	return nil
}

// Addrs lists the interface's addresses, IPv4 and IPv6.
func (s *NetlinkStack) Addrs(name string) ([]netlink.Addr, error) {
	l, err := s.link(name)
	if err != nil {
		return nil, err
	}
	as, err := s.h.AddrList(l, netlink.FAMILY_ALL)
	if err != nil {
		return nil, fmt.Errorf("addresses of %s: %w", name, err)
	}
	return as, nil
}

// AddAddr adds an address to the interface.
func (s *NetlinkStack) AddAddr(name string, a netlink.Addr) error {
	l, err := s.link(name)
	if err != nil {
		return err
	}
	if err := s.h.AddrAdd(l, &a); err != nil {
		return fmt.Errorf("add address %s to %s: %w", a.IPNet, name, err)
	}
	return nil
}

// Routes lists the main table's routes through the interface.
func (s *NetlinkStack) Routes(name string) ([]netlink.Route, error) {
	l, err := s.link(name)
	if err != nil {
		return nil, err
	}
	rs, err := s.h.RouteList(l, netlink.FAMILY_ALL)
	if err != nil {
		return nil, fmt.Errorf("routes of %s: %w", name, err)
	}
	return rs, nil
}

// AddRoute adds r through the interface.
func (s *NetlinkStack) AddRoute(name string, r netlink.Route) error {
	l, err := s.link(name)
	if err != nil {
		return err
	}
	r.LinkIndex = l.Attrs().Index
	if err := s.h.RouteAdd(&r); err != nil {
		return fmt.Errorf("add route %s to %s: %w", r, name, err)
	}
	return nil
}
