package fence_test

import (
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/berth-io/berth/api/v1alpha1"
	"github.com/berth-io/berth/internal/fence"
)

// TestKubectlGetAttachments reads the table kubectl prints for
// `kubectl get attachments`: volume, mode, holders (node/pod), the staged
// devices (-o wide) and age.
func TestKubectlGetAttachments(t *testing.T) {
	f, _ := newFencer(t)
	cleanupVolume(t, "vol-table")
	mustAcquire(t, f, stageReq("vol-table", "table-a", v1.ReadWriteOnce))
	mustAcquire(t, f, podReq("vol-table", "table-a", fakePod("table-p1"), v1.ReadWriteOnce))
	if err := f.ReportStaged(ctxT(t), "vol-table", fence.Staged{Node: "table-a", DevicePath: "/dev/loop9", StagingPath: "/s"}); err != nil {
		t.Fatal(err)
	}

	hc, err := rest.HTTPClientFor(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	u, err := url.JoinPath(env.Config.Host, env.Config.APIPath, "/apis/berth.io/v1alpha1/attachments/vol-table")
	if err != nil {
		t.Fatal(err)
	}
	req, err := http.NewRequestWithContext(ctxT(t), http.MethodGet, u, http.NoBody)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Accept", "application/json;as=Table;v=v1;g=meta.k8s.io")
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET table: %d %v %s", resp.StatusCode, err, body)
	}
	var table metav1.Table
	if err := json.Unmarshal(body, &table); err != nil {
		t.Fatal(err)
	}
	var cols []string
	for _, c := range table.ColumnDefinitions {
		cols = append(cols, c.Name)
	}
	if got := strings.Join(cols, ","); got != "Name,Mode,Holders,Devices,Age" {
		t.Fatalf("columns %s", got)
	}
	row := table.Rows[0].Cells
	if row[0] != "vol-table" || row[1] != "ReadWriteOnce" || row[2] != "table-a, table-a/default/table-p1" || row[3] != "table-a=/dev/loop9" {
		t.Fatalf("row %v", row)
	}
}

// TestReportStaged: a node's staged device goes into the status, in node
// order, beside other nodes' entries; unstaged, it goes; an entry of a node
// that no longer holds the volume is dropped by the next report; a volume
// nobody holds has no Attachment and nothing to report.
func TestReportStaged(t *testing.T) {
	f, _ := newFencer(t)
	c, ctx := env.Client, ctxT(t)
	cleanupVolume(t, "vol-status")
	mustAcquire(t, f, stageReq("vol-status", "st-b", v1.ReadWriteMany))
	mustAcquire(t, f, stageReq("vol-status", "st-a", v1.ReadWriteMany))
	report := func(node, dev string) {
		t.Helper()
		if err := f.ReportStaged(ctx, "vol-status", fence.Staged{Node: node, DevicePath: dev, StagingPath: "/staging/" + node}); err != nil {
			t.Fatal(err)
		}
	}
	devices := func() string {
		t.Helper()
		var att v1.Attachment
		if err := c.Get(ctx, client.ObjectKey{Name: "vol-status"}, &att); err != nil {
			t.Fatal(err)
		}
		return att.Status.Devices
	}
	report("st-b", "/dev/loop2")
	report("st-a", "/dev/nbd0")
	if got := devices(); got != "st-a=/dev/nbd0, st-b=/dev/loop2" {
		t.Fatalf("devices %q", got)
	}
	report("st-a", "")
	if got := devices(); got != "st-b=/dev/loop2" {
		t.Fatalf("after st-a unstaged: %q", got)
	}
	report("st-a", "/dev/loop5")
	if err := f.Release(ctx, "vol-status", "st-b", stageReq("vol-status", "st-b", v1.ReadWriteMany).MountDir); err != nil {
		t.Fatal(err)
	}
	report("st-a", "/dev/loop5")
	if got := devices(); got != "st-a=/dev/loop5" {
		t.Fatalf("after st-b released: %q", got)
	}
	if err := f.ReportStaged(ctx, "vol-none", fence.Staged{Node: "st-a", DevicePath: "/dev/loop1"}); err != nil {
		t.Fatalf("report on a volume nobody holds: %v", err)
	}
}
