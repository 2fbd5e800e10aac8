package network

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/berth-io/berth/internal/testenv"
)

// The root tests build their own small network, never touching the host's:
// a "host" namespace with a bridge br0 as the macvlan parent, a peer
// namespace with a macvlan on br0 serving TCP at peerIP, and holder
// processes in namespaces of their own with a macvlan on br0 each. All of it
// goes when the test's handles close and its processes end.

const (
	peerIP    = "10.77.0.2"
	storeNet  = "10.88.0.0/16" // reached through the peer, a route to copy
	holderIfc = "net1"
)

type lab struct {
	t        *testing.T
	host     netns.NsHandle
	hostNL   *netlink.Handle
	hostSt   *NetlinkStack
	parent   int
	peer     netns.NsHandle
	peerAddr string
	dir      Dir
}

// newNS creates a network namespace (only lo, up) without moving this goroutine.
func newNS(t *testing.T) netns.NsHandle { return testenv.NetNS(t) }

func newLab(t *testing.T) *lab {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: creates network namespaces, a bridge and macvlan interfaces")
	}
	l := &lab{t: t, host: newNS(t), peer: newNS(t), dir: Dir(t.TempDir())}
	var err error
	if l.hostNL, err = netlink.NewHandleAt(l.host); err != nil {
		t.Fatalf("netlink in test host namespace: %v", err)
	}
	t.Cleanup(l.hostNL.Close)
	if l.hostSt, err = OpenStack(l.host); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(l.hostSt.Close)
	br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: "br0"}}
	if err := l.hostNL.LinkAdd(br); err != nil {
		t.Skipf("this kernel cannot create a bridge (macvlan parent): %v", err)
	}
	brl, err := l.hostNL.LinkByName("br0")
	if err != nil {
		t.Fatal(err)
	}
	if err := l.hostNL.LinkSetUp(brl); err != nil {
		t.Fatal(err)
	}
	l.parent = brl.Attrs().Index
	peerNL, err := netlink.NewHandleAt(l.peer)
	if err != nil {
		t.Fatal(err)
	}
	defer peerNL.Close()
	l.macvlanInto(t, "peer0", nil, func(link netlink.Link) error { return l.hostNL.LinkSetNsFd(link, int(l.peer)) })
	l.configure(t, peerNL, "peer0", peerIP, false)

	var ln net.Listener
	if err := NewInNamespace(ThreadSwitcher{}).Do(l.peer, func() (err error) {
		ln, err = net.Listen("tcp", net.JoinHostPort(peerIP, "0"))
		return err
	}); err != nil {
		t.Fatalf("listen in peer namespace: %v", err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	l.peerAddr = ln.Addr().String()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			_, _ = c.Write([]byte("peer\n"))
			_ = c.Close()
		}
	}()
	return l
}

// macvlanInto creates a macvlan on br0 in the test host namespace and moves
// it with move; an unsupported kernel skips the test.
func (l *lab) macvlanInto(t *testing.T, name string, mac net.HardwareAddr, move func(netlink.Link) error) {
	t.Helper()
	m := &netlink.Macvlan{Mode: netlink.MACVLAN_MODE_BRIDGE}
	m.Name, m.ParentIndex, m.HardwareAddr = name, l.parent, mac
	if err := l.hostNL.LinkAdd(m); err != nil {
		if errors.Is(err, syscall.EOPNOTSUPP) || strings.Contains(err.Error(), "not supported") {
			t.Skipf("this kernel has no macvlan: %v", err)
		}
		t.Fatalf("create macvlan %s: %v", name, err)
	}
	link, err := l.hostNL.LinkByName(name)
	if err != nil {
		t.Fatal(err)
	}
	if err := move(link); err != nil {
		_ = l.hostNL.LinkDel(link)
		t.Fatalf("move %s: %v", name, err)
	}
}

// configure gives an interface ip/24, sets it up and, with route, a route
// to storeNet through the peer.
func (l *lab) configure(t *testing.T, h *netlink.Handle, name, ip string, route bool) {
	t.Helper()
	link, err := h.LinkByName(name)
	if err != nil {
		t.Fatal(err)
	}
	addr, err := netlink.ParseAddr(ip + "/24")
	if err != nil {
		t.Fatal(err)
	}
	if err := h.AddrAdd(link, addr); err != nil {
		t.Fatalf("address %s on %s: %v", ip, name, err)
	}
	// An IPv6 address too: going down flushes it, so restoring an original
	// must add it back.
	v6, err := netlink.ParseAddr(ipv6Of(ip) + "/64")
	if err != nil {
		t.Fatal(err)
	}
	v6.Flags = unix.IFA_F_NODAD
	if err := h.AddrAdd(link, v6); err != nil {
		t.Fatalf("address %s on %s: %v", v6, name, err)
	}
	if err := h.LinkSetUp(link); err != nil {
		t.Fatal(err)
	}
	if route {
		_, dst, _ := net.ParseCIDR(storeNet)
		if err := h.RouteAdd(&netlink.Route{LinkIndex: link.Attrs().Index, Dst: dst, Gw: net.ParseIP(peerIP)}); err != nil {
			t.Fatalf("route on %s: %v", name, err)
		}
	}
}

// ipv6Of is the test's IPv6 address beside an IPv4 one: fd00:77::<last byte>.
func ipv6Of(ip string) string {
	return fmt.Sprintf("fd00:77::%x", net.ParseIP(ip).To4()[3])
}

// holder is a holder process in a namespace of its own.
type holder struct {
	uid, ip string
	mac     net.HardwareAddr
	cmd     *exec.Cmd
	ns      netns.NsHandle
	nl      *netlink.Handle
}

const holderEnvDir, holderEnvUID = "BERTH_TEST_HOLDER_DIR", "BERTH_TEST_HOLDER_UID"

// childProcess begins a helper process of the root tests: it skips the
// test unless env names the holders' folder, stops on SIGTERM, and opens
// rtnetlink in the process's namespace.
// childReadyEnv names a file a child process makes once it handles
// SIGTERM, for a parent that stops it with one.
const childReadyEnv = "BERTH_TEST_CHILD_READY"

func childProcess(t *testing.T, env, what string) (context.Context, Dir, *NetlinkStack) {
	dir := os.Getenv(env)
	if dir == "" {
		t.Skip(what + " of the root tests, not a test")
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	t.Cleanup(stop)
	if ready := os.Getenv(childReadyEnv); ready != "" {
		// SIGTERM is handled from here on: the parent may send it.
		if err := os.WriteFile(ready, nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	st, err := OpenOwnStack()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	return ctx, Dir(dir), st
}

// TestHolderProcess is the holder process of the root tests.
func TestHolderProcess(t *testing.T) {
	ctx, dir, st := childProcess(t, holderEnvDir, "the holder process")
	h := NewHolder(st, SelfNSID, dir, testr.New(t))
	h.Interval = 20 * time.Millisecond
	if err := h.Run(ctx, Record{PodUID: os.Getenv(holderEnvUID), Interface: holderIfc}); err != nil {
		t.Fatal(err)
	}
}

// startHolder starts a holder process in a new namespace, gives it a
// macvlan named net1 with mac and ip, and waits for its record.
func (l *lab) startHolder(t *testing.T, uid, ip string, mac net.HardwareAddr) *holder {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestHolderProcess$")
	cmd.Env = append(os.Environ(), holderEnvDir+"="+string(l.dir), holderEnvUID+"="+uid)
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNET, Pdeathsig: syscall.SIGKILL}
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatalf("start holder: %v", err)
	}
	h := &holder{uid: uid, ip: ip, mac: mac, cmd: cmd}
	t.Cleanup(func() {
		h.stop(t, syscall.SIGKILL)
		if t.Failed() {
			t.Logf("holder %s output:\n%s", uid, out.String())
		}
	})
	var err error
	if h.ns, err = netns.GetFromPid(cmd.Process.Pid); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = h.ns.Close() })
	if h.nl, err = netlink.NewHandleAt(h.ns); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(h.nl.Close)
	tmp := "h" + uid
	l.macvlanInto(t, tmp, mac, func(link netlink.Link) error { return l.hostNL.LinkSetNsFd(link, int(h.ns)) })
	link, err := h.nl.LinkByName(tmp)
	if err != nil {
		t.Fatal(err)
	}
	if err := h.nl.LinkSetName(link, holderIfc); err != nil {
		t.Fatal(err)
	}
	l.configure(t, h.nl, holderIfc, ip, true)
	waitFor(t, "holder "+uid+" record", func() bool { _, err := l.dir.Read(uid); return err == nil })
	return h
}

// stop signals the holder process by PID and waits for it.
func (h *holder) stop(t *testing.T, sig syscall.Signal) {
	if h.cmd.ProcessState != nil {
		return
	}
	_ = h.cmd.Process.Signal(sig)
	_ = h.cmd.Wait()
}

func waitFor(t *testing.T, what string, ok func() bool) {
	t.Helper()
	testenv.WaitFor(t, 10*time.Second, what, ok)
}

// dialPeer connects to the peer from inside ns and returns the local IP.
func (l *lab) dialPeer(ns netns.NsHandle) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	c, err := NewInNamespace(ThreadSwitcher{}).Dial(ctx, ns, "tcp", l.peerAddr)
	if err != nil {
		return "", err
	}
	defer func() { _ = c.Close() }()
	buf := make([]byte, 5)
	if _, err := c.Read(buf); err != nil || string(buf) != "peer\n" {
		return "", fmt.Errorf("read from peer: %q, %v", buf, err)
	}
	return c.LocalAddr().(*net.TCPAddr).IP.String(), nil
}
