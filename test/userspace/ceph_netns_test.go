//go:build ceph

package userspace

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/berth-io/berth/api/v1alpha1"
	"github.com/berth-io/berth/internal/keeper"
	"github.com/berth-io/berth/internal/network"
	"github.com/berth-io/berth/internal/testenv"
	"github.com/berth-io/berth/internal/testenv/testceph"
)

// cephNetns is the network namespace the netns test's Ceph runs in, the
// stand-in of a holder pod's: the monitors and OSDs are reachable from
// inside it only (127.0.0.1 there is not this host's).
const cephNetns = "berth-t-usnetns"

// A test Ceph of its own, inside cephNetns (folder and ports apart from
// the package's other one).
var cephNetnsLazy = &testceph.Lazy{Name: "userspace-netns", Options: testceph.Options{Dir: "/var/lib/berth-ceph-userspace-netns-test",
	Addr: "127.0.0.1", Netns: cephNetns, MonPort: 3317, PortMin: 7700, PortMax: 7799},
	AtEnd: func(stop func()) {
		fx.atEnd = append(fx.atEnd, func() {
			stop()
			if out, err := exec.Command("ip", "netns", "del", cephNetns).CombinedOutput(); err != nil {
				fmt.Fprintf(os.Stderr, "remove network namespace %s: %v: %s\n", cephNetns, err, out)
			}
		})
	}}

// netnsCeph makes cephNetns (once; lo up) and returns its test Ceph.
func netnsCeph(t *testing.T) *testceph.Cluster {
	t.Helper()
	if _, err := os.Stat("/run/netns/" + cephNetns); err != nil {
		for _, args := range [][]string{{"netns", "add", cephNetns}, {"-n", cephNetns, "link", "set", "lo", "up"}} {
			if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
				t.Fatalf("ip %s: %v: %s", strings.Join(args, " "), err, out)
			}
		}
	}
	return cephNetnsLazy.Get(t)
}

// netnsCluster makes a ceph StorageCluster on c in the multus netns mode,
// whose holder on this node is a process in cephNetns (with holder true).
func (f *fixture) netnsCluster(t *testing.T, name string, c *testceph.Cluster, holder bool) {
	t.Helper()
	f.cephCluster(t, name, c.Monitors, c.Pool)
	sc := &v1.StorageCluster{}
	if err := f.env.Client.Get(t.Context(), client.ObjectKey{Name: name}, sc); err != nil {
		t.Fatal(err)
	}
	sc.Spec.Network = v1.NetworkSpec{Provider: v1.NetworkProviderMultus, Selectors: &v1.NetworkSelectors{Public: "default/storage"}}
	if err := f.env.Client.Update(t.Context(), sc); err != nil {
		t.Fatal(err)
	}
	dir := network.Dir(f.holdersDir() + "/" + name)
	if err := os.MkdirAll(string(dir), 0o755); err != nil {
		t.Fatal(err)
	}
	if !holder {
		return
	}
	// The holder: a process that only lives in the namespace.
	cmd := exec.Command("ip", "netns", "exec", cephNetns, "sleep", "infinity")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	// The agent takes a namespace only from a process of the record's pod
	// (its kubelet cgroup names the pod's UID).
	uid := fmt.Sprintf("00000000-0000-4000-8000-%012d", cmd.Process.Pid)
	testenv.PodCgroup(t, cmd.Process.Pid, uid)
	id := netnsID(t, "/run/netns/"+cephNetns)
	if err := dir.Write(network.Record{PodUID: uid, PodNamespace: "berth-system", PodName: "holder-" + name,
		Interface: "lo", PID: cmd.Process.Pid, NetNS: id}); err != nil {
		t.Fatal(err)
	}
}

func netnsID(t *testing.T, path string) network.NSID {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		t.Fatal(err)
	}
	return network.NSID{Dev: st.Dev, Ino: st.Ino}
}

// inNetns fails unless process pid is in cephNetns.
func inNetns(t *testing.T, pid int) {
	t.Helper()
	if got, want := netnsID(t, fmt.Sprintf("/proc/%d/ns/net", pid)), netnsID(t, "/run/netns/"+cephNetns); got != want {
		t.Fatalf("blockdev server %d is in network namespace %d, want the holder's %d", pid, got.Ino, want.Ino)
	}
}

// The netns mode on a Ceph reachable only inside a holder's namespace: a
// userspace ceph volume staged by the agent does I/O, its server runs in
// the namespace, and so does each server the healer starts, after the
// server alone is killed and after the agent and server are; while the
// holder is gone the running server serves on and a dead one waits; the same
// volume in a cluster on the host network fails clearly (its monitors are
// not reachable there), and a netns-mode cluster with no holder on the
// node is refused before anything is made. Each leaves nothing.
func TestCephNetnsMode(t *testing.T) {
	f := setup(t)
	c := netnsCeph(t)
	nc := f.node(t)
	ctx := t.Context()

	const name = "ceph-netns-1"
	f.netnsCluster(t, name, c, true)
	spec := rbdImage(ctx, t, c, name, "64M")
	f.cephVolume(t, name, name, spec, "64Mi", v1.MounterUserspace)
	m, secrets := f.paths(t, name), cephSecrets(t, c)
	f.stagePublish(t, nc, m, secrets)
	sums := writeFiles(t, m.target, "before", 4)
	pid := f.waitServer(t, name, 0, time.Second)
	inNetns(t, pid)

	// The server alone dies: the agent's healer starts one in the namespace.
	if err := killWait(pid); err != nil {
		t.Fatal(err)
	}
	pid = f.waitServer(t, name, pid, 30*time.Second)
	inNetns(t, pid)
	verifyFiles(t, sums)

	// The holder goes (its record withdrawn): the running server keeps
	// serving; one that dies then is not started outside the namespace,
	// the healer waits for a holder, and starts it once one is back.
	holders := network.Dir(f.holdersDir() + "/" + name)
	recs, err := holders.List()
	if err != nil || len(recs) != 1 {
		t.Fatalf("holder records %+v, %v; want the one", recs, err)
	}
	rec := recs[0]
	if err := holders.Remove(rec.PodUID); err != nil {
		t.Fatal(err)
	}
	verifyFiles(t, writeFiles(t, m.target, "noholder", 1))
	if err := killWait(pid); err != nil {
		t.Fatal(err)
	}
	time.Sleep(5 * time.Second) // two heal passes
	if vols, err := keeper.NewClient(f.keeperSock).List(ctx); err != nil || len(vols) != 1 || vols[0].ServerPID != 0 {
		t.Fatalf("keeper after the holder went: %+v, %v; want the connection held, no server", vols, err)
	}
	if log, err := os.ReadFile(f.agentLog); err != nil || !strings.Contains(string(log), "no running holder pod") {
		t.Errorf("the agent's log does not say the holder is missing (%v)", err)
	}
	if err := holders.Write(rec); err != nil {
		t.Fatal(err)
	}
	pid = f.waitServer(t, name, pid, 30*time.Second)
	inNetns(t, pid)
	verifyFiles(t, sums)

	// Agent and server die: the new agent finds the holder again.
	f.crash(t)
	if err := f.startAgent(); err != nil {
		t.Fatal(err)
	}
	waitCSI(t, nc)
	pid = f.waitServer(t, name, pid, 60*time.Second)
	inNetns(t, pid)
	verifyFiles(t, sums)
	verifyFiles(t, writeFiles(t, m.target, "after", 2))

	f.unstage(t, nc, m)
	f.cephLeftNothing(t, name)
	// The killed servers' watches lapse (30 s) before the image can go.
	deadline := time.Now().Add(90 * time.Second)
	for w := watchers(t, c, spec); len(w) > 0; w = watchers(t, c, spec) {
		if time.Now().After(deadline) {
			t.Fatalf("image %s still watched by %v", spec, w)
		}
		time.Sleep(time.Second)
	}

	// The same Ceph from the host network: unreachable, a clear error.
	const host = "ceph-netns-host"
	f.cephCluster(t, host, c.Monitors, c.Pool)
	f.cephVolume(t, host, host, rbdImage(ctx, t, c, host, "64M"), "64Mi", v1.MounterUserspace)
	hm := f.paths(t, host)
	err = stageCeph(nc, hm, "ext4", secrets)
	t.Logf("provider host: %v", err)
	if status.Code(err) != codes.Unavailable {
		t.Errorf("stage on the host network: %v, want Unavailable (monitors unreachable)", err)
	}
	f.cephLeftNothing(t, host)

	// A netns-mode cluster whose holder is not on this node.
	const missing = "ceph-netns-noholder"
	f.netnsCluster(t, missing, c, false)
	f.cephVolume(t, missing, missing, rbdImage(ctx, t, c, missing, "64M"), "64Mi", v1.MounterUserspace)
	mm := f.paths(t, missing)
	err = stageCeph(nc, mm, "ext4", secrets)
	t.Logf("no holder: %v", err)
	if status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "no running holder pod") ||
		!strings.Contains(err.Error(), "nothing was made") {
		t.Errorf("stage without a holder: %v, want Unavailable saying the holder pod is missing", err)
	}
	f.cephLeftNothing(t, missing)
}
