package testenv

import (
	"os"
	"runtime"
	"testing"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
)

// NetNS returns a new network namespace with its loopback up, for root
// tests (it skips t unless root); it goes at the test's end with its last
// handle and process.
func NetNS(t testing.TB) netns.NsHandle {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: creates a network namespace")
	}
	type result struct {
		ns  netns.NsHandle
		err error
	}
	ch := make(chan result, 1)
	go func() {
		// netns.New enters the namespace it makes: on a thread of its own,
		// discarded (left locked) unless it gets back.
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			runtime.UnlockOSThread()
			ch <- result{err: err}
			return
		}
		defer func() { _ = orig.Close() }()
		ns, err := netns.New()
		if serr := netns.Set(orig); serr == nil {
			runtime.UnlockOSThread()
		}
		ch <- result{ns, err}
	}()
	r := <-ch
	if r.err != nil {
		t.Fatalf("create network namespace: %v", r.err)
	}
	t.Cleanup(func() { _ = r.ns.Close() })
	h, err := netlink.NewHandleAt(r.ns)
	if err != nil {
		t.Fatalf("netlink in new namespace: %v", err)
	}
	defer h.Close()
	lo, err := h.LinkByName("lo")
	if err == nil {
		err = h.LinkSetUp(lo)
	}
	if err != nil {
		t.Fatalf("loopback up in new namespace: %v", err)
	}
	return r.ns
}
