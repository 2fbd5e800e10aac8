package network

import (
	"errors"
	"net"
	"strings"
	"testing"

	"github.com/go-logr/logr/testr"
	"github.com/vishvananda/netlink"
)

func mustAddr(t *testing.T, s string) netlink.Addr {
	t.Helper()
	a, err := netlink.ParseAddr(s)
	if err != nil {
		t.Fatal(err)
	}
	return *a
}

func mustNet(t *testing.T, s string) *net.IPNet {
	t.Helper()
	_, n, err := net.ParseCIDR(s)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// fakeNode is a host namespace with one holder "pod-a" whose net1 has an
// IPv4 and an IPv6 address (plus the link-local one the kernel makes), a
// route to 10.88.0.0/16, a default route and the kernel's prefix route.
func fakeNode(t *testing.T) (host *fakeStack, holder *fakeStack, rec Record) {
	host, holder = newFakeStack(), newFakeStack()
	host.add(Link{Name: "eth0", Kind: "device", Up: true}, nil, []netlink.Route{{Dst: nil, Gw: net.ParseIP("192.168.0.1")}})
	lbl := mustAddr(t, "10.77.0.10/24")
	lbl.Label = "net1"
	holder.add(Link{Name: "net1", Kind: "macvlan", MAC: macA, MTU: 1400, ParentIndex: 4, Mode: netlink.MACVLAN_MODE_BRIDGE, Up: true},
		[]netlink.Addr{lbl, mustAddr(t, "fd00:77::10/64"), mustAddr(t, "fe80::1/64")},
		[]netlink.Route{
			{Dst: mustNet(t, "10.88.0.0/16"), Gw: net.ParseIP("10.77.0.2"), Protocol: 4},
			{Dst: nil, Gw: net.ParseIP("10.77.0.1"), Protocol: 4},
			{Dst: mustNet(t, "10.77.0.0/24"), Protocol: 2}, // kernel
		})
	return host, holder, Record{PodUID: "pod-a", Interface: "net1", NetNS: NSID{Ino: 1}}
}

func TestMoverCopiesAndRestores(t *testing.T) {
	host, holder, rec := fakeNode(t)
	m := NewMover(host, fakeNamespaces{"pod-a": holder}, fakeRecords{rec}, testr.New(t))
	if err := m.Sync(); err != nil {
		t.Fatal(err)
	}
	c, err := host.get(CopyName("pod-a"))
	if err != nil {
		t.Fatal(err)
	}
	if c.MAC.String() != macA.String() || c.MTU != 1400 || c.ParentIndex != 4 || c.Mode != netlink.MACVLAN_MODE_BRIDGE || !c.Up {
		t.Errorf("copy = %+v", c.Link)
	}
	if mk, ok := ownedCopy(c.Link); !ok || mk.state != stateCopied || mk.iface != "net1" {
		t.Errorf("copy alias %q: %+v, %v", c.Alias, mk, ok)
	}
	var addrs []string
	for _, a := range c.addrs {
		addrs = append(addrs, a.IPNet.String())
		if a.Label != "" {
			t.Errorf("address %s keeps the original's label %q", a.IPNet, a.Label)
		}
	}
	if got := strings.Join(addrs, " "); got != "10.77.0.10/24 fd00:77::10/64" {
		t.Errorf("copy addresses %s; want the IPv4 and the global IPv6 one", got)
	}
	if len(c.routes) != 1 || c.routes[0].Dst.String() != "10.88.0.0/16" {
		t.Errorf("copy routes %v; want only the one to 10.88.0.0/16 (no default, no kernel route)", c.routes)
	}
	if holder.links["net1"].Up {
		t.Error("original up beside its copy")
	}
	// A second round changes nothing.
	if err := m.Sync(); err != nil || host.links[CopyName("pod-a")].Index != c.Index {
		t.Errorf("second round: %v, copy replaced", err)
	}
	if err := m.RemoveAll(); err != nil {
		t.Fatal(err)
	}
	if _, ok := host.links[CopyName("pod-a")]; ok {
		t.Error("copy left after RemoveAll")
	}
	orig := holder.links["net1"]
	if !orig.Up || len(orig.routes) != 2 {
		t.Errorf("original after RemoveAll: up=%v routes %v; want up with its route and its default route back", orig.Up, orig.routes)
	}
	if _, ok := host.links["eth0"]; !ok {
		t.Error("RemoveAll removed the host's own interface")
	}
}

func TestMoverRefusesNonMacvlan(t *testing.T) {
	host, holder, rec := fakeNode(t)
	holder.links["net1"].Kind = "ipvlan"
	err := NewMover(host, fakeNamespaces{"pod-a": holder}, fakeRecords{rec}, testr.New(t)).Sync()
	if err == nil || !strings.Contains(err.Error(), "macvlan interfaces only") {
		t.Fatalf("Sync = %v", err)
	}
	if len(host.links) != 1 || !holder.links["net1"].Up {
		t.Error("a refused copy changed something")
	}
}

// TestMoverFailureAtEachStep: whatever step fails, nothing of the copy is
// left and the original is whole; the next round copies.
func TestMoverFailureAtEachStep(t *testing.T) {
	for step := 1; ; step++ {
		host, holder, rec := fakeNode(t)
		f := &failAt{step: step}
		m := NewMover(f.wrap(host), failingNamespaces{fakeNamespaces{"pod-a": holder}, f}, fakeRecords{rec}, testr.New(t))
		err := m.Sync()
		if f.calls < step {
			// create, 2 addresses, original down, copy up, route, alias
			if err != nil || step != 8 {
				t.Fatalf("no failure at step %d: %v; want a whole copy after 7 steps", step, err)
			}
			break
		}
		if !errors.Is(err, errInjected) {
			t.Fatalf("step %d: %v", step, err)
		}
		if len(host.links) != 1 {
			t.Errorf("step %d (%s): host has %v", step, f.failed, host.links)
		}
		orig := holder.links["net1"]
		if !orig.Up || len(orig.addrs) != 3 || len(orig.routes) < 2 {
			t.Errorf("step %d (%s): original up=%v addrs %v routes %v", step, f.failed, orig.Up, orig.addrs, orig.routes)
		}
		f.step = 0
		if err := m.Sync(); err != nil || host.links[CopyName("pod-a")] == nil {
			t.Errorf("step %d: the next round: %v", step, err)
		}
	}
}

func TestMoverRemovesOrphansAndHalfCopies(t *testing.T) {
	host, holder, rec := fakeNode(t)
	gone := Record{PodUID: "pod-gone", Interface: "net1", NetNS: NSID{Ino: 2}}
	withdrawn := "pod-withdrawn"
	host.add(Link{Name: CopyName(gone.PodUID), Kind: "macvlan", Up: true, Alias: copyAlias(stateCopied, gone)}, nil, nil)
	host.add(Link{Name: CopyName(withdrawn), Kind: "macvlan", Up: true, Alias: copyAlias(stateCopied, Record{PodUID: withdrawn, Interface: "net1"})}, nil, nil)
	// pod-a's copy, half made by a killed mover: down, addresses only.
	host.add(Link{Name: CopyName("pod-a"), Kind: "macvlan", MAC: macA, Alias: copyAlias(stateCopying, rec)}, []netlink.Addr{mustAddr(t, "10.77.0.10/24")}, nil)
	half := host.links[CopyName("pod-a")].Index
	// Look-alikes the mover never made.
	host.add(Link{Name: CopyName("pod-x"), Kind: "macvlan"}, nil, nil)
	host.add(Link{Name: "other0", Kind: "macvlan", Alias: copyAlias(stateCopied, gone)}, nil, nil)
	m := NewMover(host, fakeNamespaces{"pod-a": holder}, fakeRecords{gone, rec}, testr.New(t))
	if err := m.Sync(); err != nil {
		t.Fatal(err)
	}
	var names []string
	for n := range host.links {
		names = append(names, n)
	}
	for _, n := range []string{CopyName(gone.PodUID), CopyName(withdrawn)} {
		if host.links[n] != nil {
			t.Errorf("orphan copy %s kept", n)
		}
	}
	for _, n := range []string{"eth0", CopyName("pod-x"), "other0"} {
		if host.links[n] == nil {
			t.Errorf("%s removed; the mover did not make it", n)
		}
	}
	c := host.links[CopyName("pod-a")]
	if c == nil || c.Index == half || !c.Up || len(c.routes) != 1 {
		t.Errorf("pod-a's half copy not replaced by a whole one: %+v", c)
	}
}

func TestOwnedCopy(t *testing.T) {
	rec := Record{PodUID: "0b5e4c1a-9d2f-4a61-8c3e-5f7a1b2c3d4e", Interface: "net1"}
	for _, tc := range []struct {
		l    Link
		want bool
	}{
		{Link{Name: CopyName(rec.PodUID), Alias: copyAlias(stateCopied, rec)}, true},
		{Link{Name: CopyName(rec.PodUID), Alias: copyAlias(stateCopying, rec)}, true},
		{Link{Name: CopyName(rec.PodUID)}, false},
		{Link{Name: CopyName("other"), Alias: copyAlias(stateCopied, rec)}, false},
		{Link{Name: "eth0", Alias: copyAlias(stateCopied, rec)}, false},
		{Link{Name: CopyName(rec.PodUID), Alias: "berth.io/mover garbage"}, false},
	} {
		if _, got := ownedCopy(tc.l); got != tc.want {
			t.Errorf("ownedCopy(%+v) = %v, want %v", tc.l, got, tc.want)
		}
	}
	if n := CopyName(rec.PodUID); len(n) != 15 {
		t.Errorf("copy name %q: %d characters, want 15", n, len(n))
	}
}

// recordList is a holder folder whose records a test changes between rounds.
type recordList struct{ recs []Record }

func (r *recordList) List() ([]Record, error) { return r.recs, nil }

// TestMoverRestoresAHolderThatWithdrew: a holder that withdraws its record
// (stopping) loses its copy; its namespace still lives, so its original
// comes back whole; a restarted holder is then copied with its whole
// configuration again.
func TestMoverRestoresAHolderThatWithdrew(t *testing.T) {
	host, holder, rec := fakeNode(t)
	recs := &recordList{recs: []Record{rec}}
	m := NewMover(host, fakeNamespaces{"pod-a": holder}, recs, testr.New(t))
	if err := m.Sync(); err != nil {
		t.Fatal(err)
	}
	recs.recs = nil
	if err := m.Sync(); err != nil {
		t.Fatal(err)
	}
	if host.links[CopyName("pod-a")] != nil {
		t.Fatal("copy kept after its holder withdrew")
	}
	if orig := holder.links["net1"]; !orig.Up || len(orig.routes) != 2 {
		t.Errorf("original after withdrawal: up=%v routes %v; want it whole", orig.Up, orig.routes)
	}
	recs.recs = []Record{rec}
	if err := m.Sync(); err != nil {
		t.Fatal(err)
	}
	if c := host.links[CopyName("pod-a")]; c == nil || len(c.routes) != 1 || len(c.addrs) != 2 {
		t.Errorf("copy of the returned holder: %+v", c)
	}
}
