//go:build e2e

package e2e

import (
	"encoding/json"
	"fmt"
	"net"
	"os/exec"
	"regexp"
	"strings"

	v1 "github.com/berth-io/berth/api/v1alpha1"
	"github.com/berth-io/berth/internal/network"
)

// cephAddrs is the part of `ceph osd dump` / `ceph mon dump` (JSON) that
// says where each daemon listens.
type cephAddrs struct {
	AddrVec []struct {
		Addr string `json:"addr"`
	} `json:"addrvec"`
}

// cephOnStorageNetworks checks that the test Ceph of a multus cluster
// (hack/cluster/ceph.sh) is reachable only over the storage networks: its
// netns has addresses and routes on the public and cluster networks only;
// the monitor and the OSDs' client side listen on the public network, the
// OSDs' replication on the cluster network; and a node reaches the Ceph
// public address only through a storage interface: the mover's copy in
// the mover mode, none at all in the netns mode (the agent goes through
// its holder's namespace there).
func (s *scenario) cephOnStorageNetworks(mode v1.MultusMode) {
	s.t.Helper()
	t := s.t
	vars := s.env.Vars
	netns, public, cluster := vars["CEPH_NETNS"], vars["CEPH_PUBLIC_IP"], vars["CEPH_CLUSTER_IP"]
	if netns == "" || public == "" || cluster == "" {
		t.Fatalf("cluster.env has MULTUS=1 but CEPH_NETNS %q, CEPH_PUBLIC_IP %q, CEPH_CLUSTER_IP %q", netns, public, cluster)
	}
	var nets []*net.IPNet
	for _, k := range []string{"PUBLIC_NET", "CLUSTER_NET"} {
		_, n, err := net.ParseCIDR(vars[k])
		if err != nil {
			t.Fatalf("cluster.env %s %q: %v", k, vars[k], err)
		}
		nets = append(nets, n)
	}
	onStorage := func(ip string) bool {
		a := net.ParseIP(ip)
		return a != nil && (nets[0].Contains(a) || nets[1].Contains(a))
	}

	// The netns: its IPv4 addresses (lo's aside) and routes.
	out := s.run("ip", "-n", netns, "-o", "-4", "addr", "show")
	for _, m := range regexp.MustCompile(`inet (\S+)/\d+`).FindAllStringSubmatch(out, -1) {
		if m[1] != "127.0.0.1" && !onStorage(m[1]) {
			t.Errorf("the Ceph netns %s has address %s, off the storage networks %v:\n%s", netns, m[1], nets, out)
		}
	}
	routes := s.run("ip", "-n", netns, "-4", "route", "show", "table", "all")
	for _, line := range strings.Split(strings.TrimSpace(routes), "\n") {
		f := strings.Fields(line)
		if len(f) == 0 || f[0] == "local" || f[0] == "broadcast" {
			continue
		}
		dst := f[0]
		if _, n, err := net.ParseCIDR(dst); err != nil || !onStorage(n.IP.String()) {
			t.Errorf("the Ceph netns %s routes %q, off the storage networks %v", netns, line, nets)
		}
	}

	// Where Ceph says its daemons are.
	var osds struct {
		OSDs []struct {
			OSD          int       `json:"osd"`
			PublicAddrs  cephAddrs `json:"public_addrs"`
			ClusterAddrs cephAddrs `json:"cluster_addrs"`
		} `json:"osds"`
	}
	s.cephJSON(&osds, "osd", "dump")
	var mons struct {
		Mons []struct {
			Name        string    `json:"name"`
			PublicAddrs cephAddrs `json:"public_addrs"`
		} `json:"mons"`
	}
	s.cephJSON(&mons, "mon", "dump")
	onHost := func(what, want string, a cephAddrs) {
		if len(a.AddrVec) == 0 {
			t.Errorf("%s has no address", what)
		}
		for _, v := range a.AddrVec {
			if host, _, err := net.SplitHostPort(v.Addr); err != nil || host != want {
				t.Errorf("%s at %s, want %s", what, v.Addr, want)
			}
		}
	}
	for _, m := range mons.Mons {
		onHost("mon."+m.Name, public, m.PublicAddrs)
	}
	for _, o := range osds.OSDs {
		name := fmt.Sprintf("osd.%d", o.OSD)
		onHost(name+" (public)", public, o.PublicAddrs)
		onHost(name+" (cluster)", cluster, o.ClusterAddrs)
	}
	if len(osds.OSDs) == 0 || len(mons.Mons) == 0 {
		t.Errorf("ceph names %d OSDs and %d monitors", len(osds.OSDs), len(mons.Mons))
	}

	// Each node's own network namespace: the way to the Ceph public address.
	for _, node := range s.env.Nodes() {
		nodeNetns, err := s.env.nodeVar("NODE_NETNS", node)
		if err != nil {
			t.Fatal(err)
		}
		out, err := exec.CommandContext(s.ctx, "ip", "-n", nodeNetns, "-o", "route", "get", public).CombinedOutput()
		route := strings.TrimSpace(string(out))
		dev := ""
		if m := regexp.MustCompile(` dev (\S+)`).FindStringSubmatch(route); m != nil {
			dev = m[1]
		}
		switch {
		case mode == v1.MultusModeMover && (err != nil || !network.IsCopyName(dev)):
			t.Errorf("node %s reaches Ceph's %s by %q (%v), want the mover's copy", node, public, route, err)
		case mode == v1.MultusModeNetns && err == nil:
			t.Errorf("node %s has a route to Ceph's %s: %q, want none (the netns mode uses the holder's namespace)", node, public, route)
		}
		t.Logf("node %s to Ceph %s: %s", node, public, route)
	}
	t.Logf("the test Ceph is on the storage networks only: mon and OSDs' public side at %s, OSD replication at %s", public, cluster)
}

// run runs a command of this machine and returns its output; a failure
// fails the test.
func (s *scenario) run(name string, args ...string) string {
	s.t.Helper()
	out, err := exec.CommandContext(s.ctx, name, args...).CombinedOutput()
	if err != nil {
		s.t.Fatalf("%s %s: %v: %s", name, strings.Join(args, " "), err, out)
	}
	return string(out)
}

// cephJSON runs the ceph CLI (as cephCLI) with JSON output into v.
func (s *scenario) cephJSON(v any, args ...string) {
	s.t.Helper()
	out, err := s.cephCLI(append(args, "-f", "json")...)
	if err != nil {
		s.t.Fatal(err)
	}
	// The output has stderr too: a status line may come before the JSON
	// ("dumped monmap epoch 1" comes after it).
	if i := strings.IndexByte(out, '{'); i > 0 {
		out = out[i:]
	}
	if err := json.NewDecoder(strings.NewReader(out)).Decode(v); err != nil {
		s.t.Fatalf("ceph %s: %v: %s", strings.Join(args, " "), err, out)
	}
}
