package network

import (
	"errors"
	"fmt"

	"github.com/vishvananda/netlink"
)

var errInjected = errors.New("injected failure")

// failAt fails the step-th change made through the stacks it wraps (1 is
// the first), counting across all of them.
type failAt struct {
	step, calls int
	failed      string
}

func (f *failAt) wrap(s Stack) Stack { return failingStack{Stack: s, f: f} }

func (f *failAt) next(what string) error {
	f.calls++
	if f.calls == f.step {
		f.failed = what
		return fmt.Errorf("%s: %w", what, errInjected)
	}
	return nil
}

type failingStack struct {
	Stack
	f *failAt
}

func (s failingStack) AddMacvlan(l Link) error {
	if err := s.f.next("create " + l.Name); err != nil {
		return err
	}
	return s.Stack.AddMacvlan(l)
}

func (s failingStack) SetUp(name string, up bool) error {
	if err := s.f.next(fmt.Sprintf("set %s up=%v", name, up)); err != nil {
		return err
	}
	return s.Stack.SetUp(name, up)
}

func (s failingStack) SetAlias(name, alias string) error {
	if err := s.f.next("alias " + name); err != nil {
		return err
	}
	return s.Stack.SetAlias(name, alias)
}

func (s failingStack) AddAddr(name string, a netlink.Addr) error {
	if err := s.f.next("address on " + name); err != nil {
		return err
	}
	return s.Stack.AddAddr(name, a)
}

func (s failingStack) AddRoute(name string, r netlink.Route) error {
	if err := s.f.next("route on " + name); err != nil {
		return err
	}
	return s.Stack.AddRoute(name, r)
}
