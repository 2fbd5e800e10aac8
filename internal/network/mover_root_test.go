package network

import (
	"context"
	"errors"
	"net"
	"syscall"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	"github.com/vishvananda/netlink"
)

var macA = net.HardwareAddr{0x02, 0, 0, 0x77, 0, 0x10}
var macB = net.HardwareAddr{0x02, 0, 0, 0x77, 0, 0x11}

func (l *lab) mover(t *testing.T, host Stack, nss Namespaces) *Mover {
	m := NewMover(host, nss, l.dir, testr.New(t))
	m.Interval = 50 * time.Millisecond
	return m
}

// runMover runs m until the returned stop is called; stop returns Run's error.
func runMover(m *Mover) (stop func() error) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- m.Run(ctx) }()
	return func() error { cancel(); return <-done }
}

// checkCopy checks h's copy in the host namespace: same MAC and address,
// the route through the peer, up; and h's original down.
func (l *lab) checkCopy(t *testing.T, h *holder, route bool) netlink.Link {
	t.Helper()
	c, err := l.hostNL.LinkByName(CopyName(h.uid))
	if err != nil {
		t.Fatalf("copy of %s: %v", h.uid, err)
	}
	if c.Type() != "macvlan" || c.Attrs().HardwareAddr.String() != h.mac.String() || c.Attrs().ParentIndex != l.parent {
		t.Errorf("copy %s is a %s with MAC %s on %d, want a macvlan with %s on br0 (%d)", c.Attrs().Name, c.Type(), c.Attrs().HardwareAddr, c.Attrs().ParentIndex, h.mac, l.parent)
	}
	if c.Attrs().Flags&net.FlagUp == 0 {
		t.Errorf("copy %s is down", c.Attrs().Name)
	}
	checkConfig(t, l.hostNL, c, h.ip, route)
	orig, err := h.nl.LinkByName(holderIfc)
	if err != nil {
		t.Fatal(err)
	}
	if orig.Attrs().Flags&net.FlagUp != 0 {
		t.Errorf("holder %s's original is up beside its copy", h.uid)
	}
	return c
}

// checkConfig checks link has ip/24 and, if route, the route to storeNet
// via the peer.
func checkConfig(t *testing.T, h *netlink.Handle, link netlink.Link, ip string, route bool) {
	t.Helper()
	addrs, err := h.AddrList(link, netlink.FAMILY_V4)
	if err != nil {
		t.Fatal(err)
	}
	if len(addrs) != 1 || addrs[0].IPNet.String() != ip+"/24" {
		t.Errorf("%s has addresses %v, want %s/24", link.Attrs().Name, addrs, ip)
	}
	v6, err := h.AddrList(link, netlink.FAMILY_V6)
	if err != nil {
		t.Fatal(err)
	}
	var global []string
	for _, a := range v6 {
		if !a.IP.IsLinkLocalUnicast() {
			global = append(global, a.IPNet.String())
		}
	}
	if len(global) != 1 || global[0] != ipv6Of(ip)+"/64" {
		t.Errorf("%s has IPv6 addresses %v, want %s/64", link.Attrs().Name, global, ipv6Of(ip))
	}
	routes, err := h.RouteList(link, netlink.FAMILY_V4)
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, r := range routes {
		found = found || (r.Dst != nil && r.Dst.String() == storeNet && r.Gw.String() == peerIP)
	}
	if found != route {
		t.Errorf("%s: route to %s via %s is %v, want %v: %v", link.Attrs().Name, storeNet, peerIP, found, route, routes)
	}
}

func (l *lab) noCopy(t *testing.T, uid string) {
	t.Helper()
	if _, err := l.hostNL.LinkByName(CopyName(uid)); err == nil {
		t.Errorf("copy of %s still in the host namespace", uid)
	}
}

// checkOriginal checks h's original is back up with its whole configuration
// and carries traffic to the peer in the netns mode.
func (l *lab) checkOriginal(t *testing.T, h *holder) {
	t.Helper()
	orig, err := h.nl.LinkByName(holderIfc)
	if err != nil {
		t.Fatal(err)
	}
	if orig.Attrs().Flags&net.FlagUp == 0 {
		t.Errorf("holder %s's original is still down", h.uid)
	}
	checkConfig(t, h.nl, orig, h.ip, true)
	if ip, err := l.dialPeer(h.ns); err != nil || ip != h.ip {
		t.Errorf("netns mode: dial peer from holder %s's namespace: local %s, %v; want from %s", h.uid, ip, err, h.ip)
	}
}

// TestMoverCopiesHolderInterface is the mover's life on a node: the copy has
// the holder's MAC and IP configuration and carries the host's traffic, the
// original is down meanwhile, and stopping the mover removes the copy and
// gives the holder its interface back.
func TestMoverCopiesHolderInterface(t *testing.T) {
	l := newLab(t)
	h := l.startHolder(t, "pod-a", "10.77.0.10", macA)
	if _, err := l.dialPeer(l.host); err == nil {
		t.Fatal("the test host namespace reaches the peer before any copy")
	}
	stop := runMover(l.mover(t, l.hostSt, ProcNamespaces{Proc: "/proc", AnyPod: true}))
	waitFor(t, "copy", func() bool {
		c, err := l.hostNL.LinkByName(CopyName(h.uid))
		return err == nil && c.Attrs().Alias == copyAlias(stateCopied, Record{PodUID: h.uid, Interface: holderIfc})
	})
	l.checkCopy(t, h, true)
	ip, err := l.dialPeer(l.host)
	if err != nil || ip != h.ip {
		t.Errorf("dial peer from the host namespace over the copy: local %s, %v; want from %s", ip, err, h.ip)
	}
	if err := stop(); err != nil {
		t.Fatalf("mover stop: %v", err)
	}
	l.noCopy(t, h.uid)
	l.checkOriginal(t, h)
	if _, err := l.dialPeer(l.host); err == nil {
		t.Error("the host namespace still reaches the peer after the mover stopped")
	}
}

// TestRestartedMoverRemovesOrphanCopies: a mover killed after copying
// leaves its copies; the next one removes the copy of a holder that died
// meanwhile, keeps the live holder's copy as it is, and touches no
// interface it did not make.
func TestRestartedMoverRemovesOrphanCopies(t *testing.T) {
	l := newLab(t)
	a := l.startHolder(t, "pod-a", "10.77.0.10", macA)
	b := l.startHolder(t, "pod-b", "10.77.0.11", macB)
	// Look-alikes: our prefix without our alias, our alias on another name.
	for _, name := range []string{CopyName("pod-x"), "other0"} {
		m := &netlink.Macvlan{Mode: netlink.MACVLAN_MODE_BRIDGE}
		m.Name, m.ParentIndex = name, l.parent
		if name == "other0" {
			m.Alias = copyAlias(stateCopied, Record{PodUID: "pod-b", Interface: holderIfc})
		}
		if err := l.hostNL.LinkAdd(m); err != nil {
			t.Fatal(err)
		}
	}
	// The first mover makes its copies and is killed: no stop runs.
	if err := l.mover(t, l.hostSt, ProcNamespaces{Proc: "/proc", AnyPod: true}).Sync(); err != nil {
		t.Fatalf("first mover: %v", err)
	}
	before := l.checkCopy(t, a, true)
	// The host routes storeNet through a's copy already: b's copy leaves it.
	l.checkCopy(t, b, false)
	b.stop(t, syscall.SIGKILL) // its record stays, its namespace goes

	m := l.mover(t, l.hostSt, ProcNamespaces{Proc: "/proc", AnyPod: true})
	if err := m.Sync(); err != nil {
		t.Fatalf("restarted mover: %v", err)
	}
	l.noCopy(t, b.uid)
	after := l.checkCopy(t, a, true)
	if after.Attrs().Index != before.Attrs().Index {
		t.Errorf("the live holder's copy was made again (index %d, was %d); want it kept", after.Attrs().Index, before.Attrs().Index)
	}
	if ip, err := l.dialPeer(l.host); err != nil || ip != a.ip {
		t.Errorf("dial peer over the kept copy: local %s, %v", ip, err)
	}
	if err := m.RemoveAll(); err != nil {
		t.Fatal(err)
	}
	l.noCopy(t, a.uid)
	for _, name := range []string{CopyName("pod-x"), "other0"} {
		if _, err := l.hostNL.LinkByName(name); err != nil {
			t.Errorf("the mover removed %s, which it did not make: %v", name, err)
		}
	}
	l.checkOriginal(t, a)
}

// TestFailureMidCopyLeavesNothing fails each step of a copy in turn: each
// time the host namespace is left without a copy and the holder with its
// original up and whole; the next round then copies.
func TestFailureMidCopyLeavesNothing(t *testing.T) {
	l := newLab(t)
	h := l.startHolder(t, "pod-a", "10.77.0.10", macA)
	for step := 1; ; step++ {
		f := &failAt{step: step}
		m := l.mover(t, f.wrap(l.hostSt), failingNamespaces{ProcNamespaces{Proc: "/proc", AnyPod: true}, f})
		err := m.Sync()
		calls := f.calls
		f.step = 0        // fail nothing more: the undo has run
		if calls < step { // no step left to fail: the copy is whole
			if err != nil {
				t.Fatalf("copy without failure: %v", err)
			}
			l.checkCopy(t, h, true)
			if err := m.RemoveAll(); err != nil {
				t.Fatal(err)
			}
			if step < 5 {
				t.Fatalf("a copy took only %d steps", step-1)
			}
			break
		}
		if !errors.Is(err, errInjected) {
			t.Fatalf("step %d (%s): error %v, want the injected one", step, f.failed, err)
		}
		l.noCopy(t, h.uid)
		l.checkOriginal(t, h)
		if t.Failed() {
			t.Fatalf("failing step %d (%s) left a part behind", step, f.failed)
		}
	}
	l.checkOriginal(t, h)
}

// failingNamespaces wraps the holders' stacks so that f counts their steps too.
type failingNamespaces struct {
	Namespaces
	f *failAt
}

func (n failingNamespaces) Open(r Record) (Stack, error) {
	s, err := n.Namespaces.Open(r)
	if err != nil {
		return nil, err
	}
	return n.f.wrap(s), nil
}
