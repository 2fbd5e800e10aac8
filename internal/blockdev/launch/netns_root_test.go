package launch

import (
	"context"
	"fmt"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/berth-io/berth/internal/network"
	"github.com/berth-io/berth/internal/testenv"
)

// TestStartInNetNS: a server started with NetNS reaches a listener that
// exists only inside that namespace (what librados does from its threads
// in a holder's namespace), and its process is in it; the same start
// without NetNS cannot reach it and fails.
func TestStartInNetNS(t *testing.T) {
	ns := testenv.NetNS(t)
	var ln net.Listener
	if err := network.NewInNamespace(network.ThreadSwitcher{}).Do(ns, func() (err error) {
		ln, err = net.Listen("tcp", "127.0.0.1:0")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	// Nothing accepts: the kernel completes the connection in the backlog.
	t.Cleanup(func() { _ = ln.Close() })
	port := ln.Addr().(*net.TCPAddr).Port
	// A stand-in server: ready only when it can connect to the listener.
	bin := t.TempDir() + "/server"
	script := fmt.Sprintf("#!/bin/bash\nif exec 4<>/dev/tcp/127.0.0.1/%d; then echo ready >&3; exec sleep 60; fi\necho 'error cannot reach 127.0.0.1:%d' >&3\n", port, port)
	if err := os.WriteFile(bin, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	f := os.NewFile(uintptr(ns), "test netns")
	p := Params{Binary: bin, Volume: "v", Image: "/i", Transport: TransportNBD, NetNS: f}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	proc, err := Start(ctx, p)
	if err != nil {
		t.Fatalf("start in the namespace: %v", err)
	}
	t.Cleanup(func() { _ = proc.Stop(time.Second) })
	var want, got unix.Stat_t
	if err := unix.Fstat(int(ns), &want); err != nil {
		t.Fatal(err)
	}
	if err := unix.Stat(fmt.Sprintf("/proc/%d/ns/net", proc.PID()), &got); err != nil {
		t.Fatal(err)
	}
	if got.Ino != want.Ino || got.Dev != want.Dev {
		t.Fatalf("server's network namespace %d, want %d", got.Ino, want.Ino)
	}
	self, err := netns.Get()
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = self.Close() }()
	if self.Equal(ns) {
		t.Fatal("the test's own thread ended up in the namespace")
	}

	p.NetNS = nil
	if proc, err := Start(ctx, p); err == nil {
		_ = proc.Stop(time.Second)
		t.Fatal("a server in this process's namespace reached a listener of another namespace")
	} else if !strings.Contains(err.Error(), "cannot reach") {
		t.Fatalf("start outside the namespace: %v, want the server's own reason", err)
	}
}
