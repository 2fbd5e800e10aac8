package agent

import (
	"context"
	"errors"
	"slices"
	"testing"

	"github.com/go-logr/logr"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1 "github.com/berth-io/berth/api/v1alpha1"
	"github.com/berth-io/berth/internal/fence"
)

// Unit test with fakes; the real path (a server killed, the healer's new
// one recorded in the Attachment) is TestCephFencingOnRealCeph in
// test/userspace.

// reportingFence records ReportStaged calls.
type reportingFence struct {
	fakeFence
	staged []fence.Staged
	fail   int // calls that fail before the next succeeds
}

func (f *reportingFence) ReportStaged(_ context.Context, _ string, s fence.Staged) error {
	if f.fail > 0 {
		f.fail--
		return errors.New("API server down")
	}
	f.staged = append(f.staged, s)
	return nil
}

// clientDevice is a device whose server is the Ceph client at addrs.
type clientDevice struct {
	device
	addrs []string
}

func (d clientDevice) cephClients(string) ([]string, error) { return d.addrs, nil }

func (d clientDevice) Find(context.Context, string) (string, error) { return "/dev/nbd3", nil }

// A node whose stage record stands but whose status entry was never
// written (the stage's report lost) gets one on the next report, with the
// device found now (F3): before, nothing was written, and a lock broken
// later fenced no client.
func TestReportServersRecordsAMissingEntry(t *testing.T) {
	att := &v1.Attachment{ObjectMeta: metav1.ObjectMeta{Name: "vol-a"}, Spec: v1.AttachmentSpec{AccessMode: v1.ReadWriteOnce,
		Attachments: []v1.AttachmentEntry{{Node: "node-a", MountDir: "/staging/vol-a", StagingPath: "/staging/vol-a"}}}}
	f := &reportingFence{}
	a := &Agent{node: "node-a", api: fakeAPI(t, att).Build(), fence: f, log: logr.Discard()}
	if err := a.reportServers(t.Context(), "vol-a", clientDevice{addrs: []string{"10.0.0.1:0/4"}}); err != nil {
		t.Fatal(err)
	}
	if len(f.staged) != 1 || f.staged[0].DevicePath != "/dev/nbd3" || f.staged[0].StagingPath != "/staging/vol-a" ||
		!slices.Equal(f.staged[0].CephClients, []string{"10.0.0.1:0/4"}) {
		t.Fatalf("reported %+v; want node-a's entry with /dev/nbd3, /staging/vol-a and the client", f.staged)
	}
	other := &Agent{node: "node-b", api: fakeAPI(t, att).Build(), fence: f, log: logr.Discard()}
	if err := other.reportServers(t.Context(), "vol-a", clientDevice{addrs: []string{"x"}}); err != nil || len(f.staged) != 1 {
		t.Fatalf("a node without a stage entry: reported %+v, %v; want nothing", f.staged, err)
	}
}

func TestReportServersFollowsTheNewServer(t *testing.T) {
	att := &v1.Attachment{ObjectMeta: metav1.ObjectMeta{Name: "vol-a"}, Status: v1.AttachmentStatus{Nodes: []v1.AttachmentNodeStatus{
		{Node: "node-b", DevicePath: "/dev/loop1", Staged: true, CephClients: []string{"10.0.0.2:0/2"}},
		{Node: "node-a", DevicePath: "/dev/loop7", StagingPath: "/staging/vol-a", Staged: true, CephClients: []string{"10.0.0.1:0/1"}},
	}}}
	f := &reportingFence{}
	a := &Agent{node: "node-a", api: fakeAPI(t, att).Build(), fence: f, log: logr.Discard()}

	if err := a.reportServers(t.Context(), "vol-a", clientDevice{addrs: []string{"10.0.0.1:0/1"}}); err != nil || len(f.staged) != 0 {
		t.Fatalf("same server: reported %+v, %v; want nothing", f.staged, err)
	}
	if err := a.reportServers(t.Context(), "vol-a", loopDevice{}); err != nil || len(f.staged) != 0 {
		t.Fatalf("no Ceph client: reported %+v, %v; want nothing", f.staged, err)
	}
	if err := a.reportServers(t.Context(), "vol-a", clientDevice{addrs: []string{"10.0.0.1:0/9"}}); err != nil {
		t.Fatal(err)
	}
	want := fence.Staged{Node: "node-a", DevicePath: "/dev/loop7", StagingPath: "/staging/vol-a", CephClients: []string{"10.0.0.1:0/9"}}
	if len(f.staged) != 1 || f.staged[0].DevicePath != want.DevicePath || f.staged[0].StagingPath != want.StagingPath ||
		!slices.Equal(f.staged[0].CephClients, want.CephClients) || f.staged[0].Node != want.Node {
		t.Fatalf("new server: reported %+v; want %+v (device and staging path kept)", f.staged, want)
	}
	if err := a.reportServers(t.Context(), "vol-gone", clientDevice{addrs: []string{"x"}}); err != nil {
		t.Errorf("no attachment: %v; want nothing to report", err)
	}
}

// A heal whose report failed does not fail (the server runs); the volume
// stays due until a report succeeds, and unstage forgets it.
func TestReportAfterHealRetriedUntilRecorded(t *testing.T) {
	att := &v1.Attachment{ObjectMeta: metav1.ObjectMeta{Name: "vol-a"}, Status: v1.AttachmentStatus{Nodes: []v1.AttachmentNodeStatus{
		{Node: "node-a", DevicePath: "/dev/loop7", Staged: true, CephClients: []string{"10.0.0.1:0/1"}},
	}}}
	f := &reportingFence{fail: 1}
	a := &Agent{node: "node-a", api: fakeAPI(t, att).Build(), fence: f, log: logr.Discard()}
	d := clientDevice{addrs: []string{"10.0.0.1:0/2"}}
	a.reportAfterHeal(t.Context(), "vol-a", d)
	if a.reports.current("vol-a") || len(f.staged) != 0 {
		t.Fatalf("failed report: current %t, staged %+v; want due", a.reports.current("vol-a"), f.staged)
	}
	a.reportAfterHeal(t.Context(), "vol-a", d)
	if !a.reports.current("vol-a") || len(f.staged) != 1 || !slices.Equal(f.staged[0].CephClients, d.addrs) {
		t.Fatalf("retried report: current %t, staged %+v; want the new clients recorded", a.reports.current("vol-a"), f.staged)
	}
	a.reports.set("vol-a", false)
	if a.reports.current("vol-a") {
		t.Fatal("unstaged volume still counted as reported")
	}
}

func TestLockBroken(t *testing.T) {
	for r, want := range map[v1.CleanupReason]bool{v1.ReasonNodeGone: true, v1.ReasonNodeOutOfService: true, v1.ReasonPodMoved: true,
		v1.ReasonPodGone: false, v1.ReasonClusterDeleted: false} {
		if lockBroken(r) != want {
			t.Errorf("lockBroken(%s) = %t", r, !want)
		}
	}
}
