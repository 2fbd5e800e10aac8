package agent

import (
	"fmt"
	"path/filepath"
	"testing"

	"github.com/go-logr/logr/testr"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	mountutils "k8s.io/mount-utils"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/berth-io/berth/api/v1alpha1"
	"github.com/berth-io/berth/internal/agent/errcode"
	"github.com/berth-io/berth/internal/mount"
	"github.com/berth-io/berth/internal/network"
	"github.com/berth-io/berth/internal/testenv"
)

// Unit tests of the netns mode's choices with a fake holder look-up; the
// real namespaces, servers and Ceph are in test/userspace
// (TestCephNetnsMode) and internal/blockdev/launch (TestStartInNetNS).

// fakeHolders answers OpenHolder with ns (a dup of it: the caller closes),
// or with ErrNoHolder when ns is None, and records the folders asked.
type fakeHolders struct {
	ns    netns.NsHandle
	asked *[]string
}

func (h fakeHolders) OpenHolder(dir string) (netns.NsHandle, network.Record, error) {
	*h.asked = append(*h.asked, dir)
	if !h.ns.IsOpen() {
		return netns.None(), network.Record{}, fmt.Errorf("%w: %s is empty", network.ErrNoHolder, dir)
	}
	fd, err := unix.FcntlInt(uintptr(h.ns), unix.F_DUPFD_CLOEXEC, 0)
	return netns.NsHandle(fd), network.Record{PodNamespace: "berth-system", PodName: "holder-x"}, err
}

func TestHolderFolder(t *testing.T) {
	h := newHolderNS(NetnsConfig{Dir: "/h"})
	sel := &v1.NetworkSelectors{Public: "default/storage"}
	for _, c := range []struct {
		name string
		net  v1.NetworkSpec
		want string
	}{
		{"host", v1.NetworkSpec{}, ""},
		{"multus netns (default mode)", v1.NetworkSpec{Provider: v1.NetworkProviderMultus, Selectors: sel}, "/h/c"},
		{"multus netns", v1.NetworkSpec{Provider: v1.NetworkProviderMultus, Selectors: sel, Multus: &v1.MultusSpec{Mode: v1.MultusModeNetns}}, "/h/c"},
		{"multus mover: the copies are in the host namespace", v1.NetworkSpec{Provider: v1.NetworkProviderMultus, Selectors: sel, Multus: &v1.MultusSpec{Mode: v1.MultusModeMover}}, ""},
		{"multus without a public network", v1.NetworkSpec{Provider: v1.NetworkProviderMultus}, ""},
	} {
		sc := &v1.StorageCluster{ObjectMeta: metav1.ObjectMeta{Name: "c"}, Spec: v1.StorageClusterSpec{Network: c.net}}
		if got := h.folder(sc); got != c.want {
			t.Errorf("%s: folder %q, want %q", c.name, got, c.want)
		}
	}
	if got := h.folder(nil); got != "" {
		t.Errorf("no cluster: folder %q", got)
	}
}

// netnsShareEnv is newShareEnv with cluster c in the netns mode and
// holders answering with ns.
func netnsShareEnv(t *testing.T, ns netns.NsHandle) (*stageEnv, string, *[]string) {
	t.Helper()
	e, target := newShareEnv(t, v1.ShareRunning, shareEndpoint, nil)
	vol := &v1.Volume{}
	if err := e.api.Get(t.Context(), client.ObjectKey{Name: "vol-a"}, vol); err != nil {
		t.Fatal(err)
	}
	vol.ResourceVersion = ""
	sc := &v1.StorageCluster{ObjectMeta: metav1.ObjectMeta{Name: "c"}, Spec: v1.StorageClusterSpec{Network: v1.NetworkSpec{
		Provider: v1.NetworkProviderMultus, Selectors: &v1.NetworkSelectors{Public: "default/storage"}}}}
	e.api = fakeAPI(t, vol, sc).WithStatusSubresource(vol).Build()
	asked := &[]string{}
	e.cfg.API, e.cfg.Status = e.api, e.api
	e.cfg.Netns = NetnsConfig{Dir: filepath.Join(t.TempDir(), "holders"), Holders: fakeHolders{ns: ns, asked: asked}}
	e.agent = newTestAgent(t, e.cfg)
	return e, target, asked
}

// An RWX share of a netns-mode cluster with no holder on the node: refused
// as Unavailable before the pod's entry or a mount is made.
func TestFakePublishSharedNoHolder(t *testing.T) {
	e, target, asked := netnsShareEnv(t, netns.None())
	err := e.publishPod(t, target)
	if errcode.Code(err) != codes.Unavailable {
		t.Fatalf("publish without a holder: %v, want Unavailable", err)
	}
	if len(*asked) != 1 || filepath.Base((*asked)[0]) != "c" {
		t.Errorf("holder folders asked: %v, want the cluster's", *asked)
	}
	if len(e.fence.holds) != 0 {
		t.Errorf("holds %v, want none", e.fence.holds)
	}
	if mps, _ := e.mounter.List(); len(mps) != 0 {
		t.Errorf("mounts %v, want none", mps)
	}
}

// nsMounter records the network namespace of the thread that mounts: the
// one the kernel's NFS client would connect from (the real mounter runs
// mount(8) from that thread, and the child inherits it).
type nsMounter struct {
	*mountutils.FakeMounter
	seen *uint64
}

func (m nsMounter) Mount(source, target, fsType string, opts []string) error {
	var st unix.Stat_t
	if err := unix.Stat("/proc/thread-self/ns/net", &st); err != nil {
		return err
	}
	*m.seen = st.Ino
	return m.FakeMounter.Mount(source, target, fsType, opts)
}

// With a holder, the share is mounted from the holder's namespace; this
// test's thread stays in its own. (The kernel's NFS client is missing
// here: the mounter is a fake that checks where it runs.)
func TestFakePublishSharedInHolder(t *testing.T) {
	ns := testenv.NetNS(t)
	e, target, asked := netnsShareEnv(t, ns)
	var seen uint64
	e.cfg.Mounts = mount.NewManager(nsMounter{e.mounter, &seen}, e.exec, testr.New(t))
	e.agent = newTestAgent(t, e.cfg)
	if err := e.publishPod(t, target); err != nil {
		t.Fatal(err)
	}
	if mps, _ := e.mounter.List(); len(mps) != 1 {
		t.Errorf("mounts %v, want the share", mps)
	}
	var want unix.Stat_t
	if err := unix.Fstat(int(ns), &want); err != nil {
		t.Fatal(err)
	}
	if seen != want.Ino {
		t.Errorf("mounted from network namespace %d, want the holder's %d (asked %v)", seen, want.Ino, *asked)
	}
}
