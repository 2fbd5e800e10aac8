package ceph_test

import (
	"context"
	"net"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/berth-io/berth/internal/backend/ceph"
)

// monAddr is one address of a mon_host value as MonHost writes it.
var monAddr = regexp.MustCompile(`^\[v[12]:(.+)\]$`)

// FuzzMonHost: monitor addresses come from a StorageCluster (the CRD's
// pattern is the first check, this the second) and go to librados as
// mon_host. Whatever the list (one monitor a line), MonHost either refuses
// it or returns only [vN:IP:PORT] entries, at least one per monitor, each
// with an IP address and a port in 1-65535: nothing a monitor string holds
// reaches librados as another entry or option. Seeds are the monitor
// forms the StorageCluster docs and the e2e Ceph use.
func FuzzMonHost(f *testing.F) {
	for _, s := range []string{
		"10.0.0.1:3300", "10.0.0.1:6789\n[fd00::1]:3310", "v1:10.0.0.1:3300\nv2:10.0.0.2:6789",
		"mon.example:3300", "192.168.122.10:6789", "10.0.0.1", "10.0.0.1:3300],[v1:6.6.6.6:6789",
	} {
		f.Add(s)
	}
	lookup := func(_ context.Context, host string) ([]string, error) {
		return []string{"10.0.0.7", "fd00::7"}, nil
	}
	f.Fuzz(func(t *testing.T, list string) {
		monitors := strings.Split(list, "\n")
		if len(monitors) > 16 {
			return // the CRD's MaxItems
		}
		got, err := ceph.MonHost(context.Background(), monitors, lookup)
		if err != nil {
			return
		}
		entries := strings.Split(got, ",")
		if len(entries) < len(monitors) {
			t.Fatalf("MonHost(%q) = %q: fewer entries than monitors", monitors, got)
		}
		for _, e := range entries {
			m := monAddr.FindStringSubmatch(e)
			if m == nil {
				t.Fatalf("MonHost(%q) = %q: entry %q is not [vN:HOST:PORT]", monitors, got, e)
			}
			host, port, err := net.SplitHostPort(m[1])
			if err != nil || net.ParseIP(host) == nil {
				t.Fatalf("MonHost(%q) = %q: entry %q has no IP address", monitors, got, e)
			}
			if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 || strconv.Itoa(n) != port {
				t.Fatalf("MonHost(%q) = %q: entry %q has port %q", monitors, got, e, port)
			}
		}
	})
}
