package network

import (
	"fmt"
	"sort"
	"sync"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// fakeStack is one namespace's interfaces in memory. Like the kernel, it
// drops an interface's routes when the interface goes down, and refuses
// what exists already with EEXIST.
type fakeStack struct {
	// mu guards the map for tests that add a link while a holder looks.
	mu     sync.Mutex
	links  map[string]*fakeLink
	next   int
	closed int
}

type fakeLink struct {
	Link
	addrs  []netlink.Addr
	routes []netlink.Route
}

func newFakeStack() *fakeStack { return &fakeStack{links: map[string]*fakeLink{}, next: 10} }

func (s *fakeStack) add(l Link, addrs []netlink.Addr, routes []netlink.Route) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.next++
	l.Index = s.next
	s.links[l.Name] = &fakeLink{Link: l, addrs: addrs, routes: routes}
}

func (s *fakeStack) get(name string) (*fakeLink, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	l, ok := s.links[name]
	if !ok {
		return nil, fmt.Errorf("%s: %w", name, ErrNoLink)
	}
	return l, nil
}

func (s *fakeStack) Link(name string) (Link, error) {
	l, err := s.get(name)
	if err != nil {
		return Link{}, err
	}
	return l.Link, nil
}

func (s *fakeStack) Links() ([]Link, error) {
	var out []Link
	for _, l := range s.links {
		out = append(out, l.Link)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

func (s *fakeStack) AddMacvlan(l Link) error {
	if _, ok := s.links[l.Name]; ok {
		return unix.EEXIST
	}
	l.Kind, l.Up = "macvlan", false
	s.add(l, nil, nil)
	return nil
}

func (s *fakeStack) DeleteLink(name string) error {
	if _, err := s.get(name); err != nil {
		return err
	}
	delete(s.links, name)
	return nil
}

func (s *fakeStack) SetUp(name string, up bool) error {
	l, err := s.get(name)
	if err != nil {
		return err
	}
	if !up {
		l.routes = nil
	}
	l.Up = up
	return nil
}

func (s *fakeStack) SetAlias(name, alias string) error {
	l, err := s.get(name)
	if err != nil {
		return err
	}
	l.Alias = alias
	return nil
}

func (s *fakeStack) Addrs(name string) ([]netlink.Addr, error) {
	l, err := s.get(name)
	if err != nil {
		return nil, err
	}
	return append([]netlink.Addr(nil), l.addrs...), nil
}

func (s *fakeStack) AddAddr(name string, a netlink.Addr) error {
	l, err := s.get(name)
	if err != nil {
		return err
	}
	for _, have := range l.addrs {
		if have.IPNet.String() == a.IPNet.String() {
			return unix.EEXIST
		}
	}
	l.addrs = append(l.addrs, a)
	return nil
}

func (s *fakeStack) Routes(name string) ([]netlink.Route, error) {
	l, err := s.get(name)
	if err != nil {
		return nil, err
	}
	return append([]netlink.Route(nil), l.routes...), nil
}

func (s *fakeStack) AddRoute(name string, r netlink.Route) error {
	l, err := s.get(name)
	if err != nil {
		return err
	}
	if !l.Up {
		return unix.ENETDOWN
	}
	for _, other := range s.links {
		for _, have := range other.routes {
			if fmt.Sprint(have.Dst) == fmt.Sprint(r.Dst) {
				return unix.EEXIST
			}
		}
	}
	r.LinkIndex = l.Index
	l.routes = append(l.routes, r)
	return nil
}

func (s *fakeStack) Close() { s.closed++ }

// fakeNamespaces maps pod UIDs to holder namespaces; a missing one is gone.
type fakeNamespaces map[string]*fakeStack

func (n fakeNamespaces) Open(r Record) (Stack, error) {
	s, ok := n[r.PodUID]
	if !ok {
		return nil, fmt.Errorf("holder %s: %w", r.PodUID, ErrHolderGone)
	}
	return s, nil
}

// fakeRecords is a fixed list of holder records.
type fakeRecords []Record

func (r fakeRecords) List() ([]Record, error) { return r, nil }
