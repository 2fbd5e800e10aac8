package share_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/berth-io/berth/internal/network"
	"github.com/berth-io/berth/internal/share"
	"github.com/berth-io/berth/internal/share/nfsclient"
	"github.com/berth-io/berth/internal/share/sharetest"
	"github.com/berth-io/berth/internal/testenv"
)

// clientNS is a network namespace joined to this one by a veth pair: the
// host end has hostIP/24, the namespace's end nsIP/24. Both go when the
// test ends.
func clientNS(t *testing.T, name, hostIP, nsIP string) netns.NsHandle {
	t.Helper()
	ns := testenv.NetNS(t)
	la := netlink.NewLinkAttrs()
	la.Name = name
	veth := &netlink.Veth{LinkAttrs: la, PeerName: name + "p"}
	if err := netlink.LinkAdd(veth); err != nil {
		t.Fatalf("add veth %s: %v", name, err)
	}
	t.Cleanup(func() { _ = netlink.LinkDel(veth) })
	peer, err := netlink.LinkByName(name + "p")
	if err != nil {
		t.Fatal(err)
	}
	if err := netlink.LinkSetNsFd(peer, int(ns)); err != nil {
		t.Fatal(err)
	}
	up := func(h *netlink.Handle, link, cidr string) {
		t.Helper()
		l, err := h.LinkByName(link)
		if err != nil {
			t.Fatal(err)
		}
		addr, err := netlink.ParseAddr(cidr)
		if err != nil {
			t.Fatal(err)
		}
		if err := h.AddrAdd(l, addr); err != nil {
			t.Fatalf("address %s on %s: %v", cidr, link, err)
		}
		if err := h.LinkSetUp(l); err != nil {
			t.Fatal(err)
		}
	}
	host, err := netlink.NewHandle()
	if err != nil {
		t.Fatal(err)
	}
	defer host.Close()
	up(host, name, hostIP+"/24")
	inside, err := netlink.NewHandleAt(ns)
	if err != nil {
		t.Fatal(err)
	}
	defer inside.Close()
	up(inside, name+"p", nsIP+"/24")
	return ns
}

// TestRootGaneshaServesOnlyListedClients runs the real ganesha on every
// address with one client listed: a client from another address is
// refused and writes nothing; the listed one writes and reads. A client
// added later (SetClients, as when its node joins the volume's
// Attachment) is admitted by the same ganesha process with no grace
// period, and a client dropped from the list is refused again.
func TestRootGaneshaServesOnlyListedClients(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: nfs-ganesha, network namespaces")
	}
	suffix := strconv.Itoa(os.Getpid() % 10000)
	nsA := clientNS(t, "bsa"+suffix, "198.18.71.1", "198.18.71.2")
	nsB := clientNS(t, "bsb"+suffix, "198.18.72.1", "198.18.72.2")
	g := sharetest.StartWith(t, sharetest.Options{BindAddr: "0.0.0.0", Clients: []string{"198.18.71.2"}})
	srv, export, port := g.Server, g.Dir, g.Port
	pid := func() string {
		b, err := os.ReadFile(g.State.PidFile())
		if err != nil {
			t.Fatal(err)
		}
		return strings.TrimSpace(string(b))
	}
	firstPID := pid()

	in := network.NewInNamespace(network.ThreadSwitcher{})
	// write writes name from ns to the server's address on that veth and
	// reads it back.
	write := func(ns netns.NsHandle, server, name string) error {
		data := []byte("written from " + name + "\n")
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		ep := nfsclient.Endpoint{Addr: net.JoinHostPort(server, strconv.Itoa(port)), Export: "/pv1"}
		return in.Do(ns, func() error {
			got, err := nfsclient.WriteCommitRead41(ctx, ep, name, data, 1, name)
			if err != nil {
				return err
			}
			if !bytes.Equal(got, data) {
				return fmt.Errorf("read back %q, wrote %q", got, data)
			}
			return nil
		})
	}
	refused := func(ns netns.NsHandle, server, name string) {
		t.Helper()
		err := write(ns, server, name)
		var st nfsclient.ErrNFSStatus
		if !errors.As(err, &st) {
			t.Errorf("client %s: %v, want refused with an NFS status", name, err)
		} else {
			t.Logf("client %s refused: %v", name, err)
		}
		if _, err := os.Stat(filepath.Join(export, name)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("refused client %s left its file: %v", name, err)
		}
	}

	if err := write(nsA, "198.18.71.1", "a1"); err != nil {
		t.Fatalf("listed client 198.18.71.2: %v", err)
	}
	refused(nsB, "198.18.72.1", "b1")

	// B's node joins: admitted at once, by the same process.
	start := time.Now()
	// With an IPv6 address and a CIDR in the same list: ganesha must
	// parse them all, or it keeps its old exports.
	if err := srv.SetClients([]string{"198.18.71.2", "198.18.72.2", "fd00:71::2", "10.71.0.0/16"}); err != nil {
		t.Fatal(err)
	}
	var err error
	for time.Since(start) < 10*time.Second {
		if err = write(nsB, "198.18.72.1", "b2"); err == nil {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err != nil {
		t.Fatalf("client added to the list: %v", err)
	}
	took := time.Since(start)
	t.Logf("added client admitted after %s", took)
	if p := pid(); p != firstPID {
		t.Errorf("ganesha pid %s, was %s: restarted", p, firstPID)
	}
	// A restarted server would refuse new state for the grace period (15 s).
	if took >= share.DefaultGracePeriod {
		t.Errorf("added client admitted only after %s: a grace period", took)
	}
	if log, err := os.ReadFile(g.State.LogFile()); err == nil && strings.Count(string(log), "Now IN GRACE") > 1 {
		t.Errorf("ganesha entered grace again:\n%s", log)
	}
	if err := write(nsA, "198.18.71.1", "a2"); err != nil {
		t.Errorf("first client after the change: %v", err)
	}

	// A's node leaves: refused again.
	if err := srv.SetClients([]string{"198.18.72.2"}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(500 * time.Millisecond)
	refused(nsA, "198.18.71.1", "a3")
	if err := write(nsB, "198.18.72.1", "b3"); err != nil {
		t.Errorf("remaining client: %v", err)
	}
	if p := pid(); p != firstPID {
		t.Errorf("ganesha pid %s, was %s: restarted", p, firstPID)
	}
}

// TestRootGaneshaRootSquash: with RootSquash, root (AUTH_SYS uid 0) over
// NFS is refused a root-owned folder and its files belong to the
// anonymous user; without it, to root (the default: root in a pod is
// root on the volume).
func TestRootGaneshaRootSquash(t *testing.T) {
	for _, squash := range []bool{false, true} {
		t.Run(fmt.Sprintf("squash=%t", squash), func(t *testing.T) {
			g := sharetest.StartWith(t, sharetest.Options{RootSquash: squash})
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if squash {
				// Squashed root is nobody: the root-owned 0755 export
				// refuses it; a sticky world-writable one takes its file.
				var st nfsclient.ErrNFSStatus
				if _, err := nfsclient.WriteCommitRead41(ctx, g.Endpoint, "owned", []byte("x"), 1, "squash"); !errors.As(err, &st) {
					t.Errorf("squashed root writing into a root-owned 0755 folder: %v, want refused", err)
				}
				if err := os.Chmod(g.Dir, 0o1777); err != nil {
					t.Fatal(err)
				}
			}
			if _, err := nfsclient.WriteCommitRead41(ctx, g.Endpoint, "owned", []byte("x"), 1, "squash"); err != nil {
				t.Fatal(err)
			}
			var st unix.Stat_t
			if err := unix.Stat(filepath.Join(g.Dir, "owned"), &st); err != nil {
				t.Fatal(err)
			}
			if owner := st.Uid; squash && owner == 0 || !squash && owner != 0 {
				t.Errorf("file written by root over NFS is owned by uid %d (root squash %t)", owner, squash)
			}
			t.Logf("root squash %t: owner uid %d", squash, st.Uid)
		})
	}
}
