package network

import (
	"context"
	"errors"
	"fmt"
	"net"
	"runtime"

	"github.com/vishvananda/netns"
)

// Switcher switches the calling thread's network namespace.
type Switcher interface {
	Get() (netns.NsHandle, error)
	Set(netns.NsHandle) error
}

// ThreadSwitcher is the kernel's setns(2).
type ThreadSwitcher struct{}

// Get opens the calling thread's network namespace.
func (ThreadSwitcher) Get() (netns.NsHandle, error) { return netns.Get() }

// Set moves the calling thread into ns.
func (ThreadSwitcher) Set(ns netns.NsHandle) error { return netns.Set(ns) }

// InNamespace runs storage network operations inside a holder's network
// namespace, moving no interface: the netns mode.
type InNamespace struct {
	sw Switcher
}

// NewInNamespace returns the netns mode on sw.
func NewInNamespace(sw Switcher) InNamespace { return InNamespace{sw: sw} }

// Do runs fn on a thread of its own inside ns. Sockets fn creates stay in
// ns after Do returns, on whatever thread uses them. fn must not start
// goroutines that create sockets: they run on other threads, in this
// process's namespace.
func (n InNamespace) Do(ns netns.NsHandle, fn func() error) error {
	done := make(chan error, 1)
	go func() {
		// Locked for good unless the thread is back in its namespace: a
		// goroutine that ends locked takes its thread with it, so no other
		// goroutine ever runs in the wrong namespace.
		runtime.LockOSThread()
		orig, err := n.sw.Get()
		if err != nil {
			runtime.UnlockOSThread()
			done <- fmt.Errorf("this thread's network namespace: %w", err)
			return
		}
		defer func() { _ = orig.Close() }()
		if err := n.sw.Set(ns); err != nil {
			done <- fmt.Errorf("enter network namespace: %w", err)
			return
		}
		ferr := fn()
		if err := n.sw.Set(orig); err != nil {
			done <- errors.Join(ferr, fmt.Errorf("leave network namespace (thread discarded): %w", err))
			return
		}
		runtime.UnlockOSThread()
		done <- ferr
	}()
	return <-done
}

// Dial connects to address (a literal IP and port: resolving a name would
// send DNS queries from other threads, outside ns) from inside ns.
func (n InNamespace) Dial(ctx context.Context, ns netns.NsHandle, network, address string) (net.Conn, error) {
	host, _, err := net.SplitHostPort(address)
	if err != nil {
		return nil, err
	}
	if net.ParseIP(host) == nil {
		return nil, fmt.Errorf("dial %s in a holder's namespace: want an IP address, not a name", address)
	}
	var conn net.Conn
	err = n.Do(ns, func() error {
		var d net.Dialer
		var err error
		conn, err = d.DialContext(ctx, network, address)
		return err
	})
	return conn, err
}
