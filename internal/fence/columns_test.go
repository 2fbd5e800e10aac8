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

	v1 "github.com/berth-io/berth/api/v1alpha1"
)

// TestKubectlGetAttachments reads the table kubectl prints for
// `kubectl get attachments`: volume, mode, holders (node/pod) and age.
func TestKubectlGetAttachments(t *testing.T) {
	f, _ := newFencer(t)
	cleanupVolume(t, "vol-table")
	mustAcquire(t, f, stageReq("vol-table", "table-a", v1.ReadWriteOnce))
	mustAcquire(t, f, podReq("vol-table", "table-a", fakePod("table-p1"), v1.ReadWriteOnce))

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
	if got := strings.Join(cols, ","); got != "Name,Mode,Holders,Age" {
		t.Fatalf("columns %s", got)
	}
	row := table.Rows[0].Cells
	if row[0] != "vol-table" || row[1] != "ReadWriteOnce" || row[2] != "table-a, table-a/default/table-p1" {
		t.Fatalf("row %v", row)
	}
}
