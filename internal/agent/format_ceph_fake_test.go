package agent

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/berth-io/berth/api/v1alpha1"
	"github.com/berth-io/berth/internal/backend"
	"github.com/berth-io/berth/internal/backend/ceph"
	"github.com/berth-io/berth/internal/volerr"
)

// Unit tests of where a ceph volume's format record is read and written;
// the real path (RBD image metadata on a real Ceph, a stage that refuses to
// format a wiped volume and its clone) is test/userspace's
// TestCephFormatRecordOnRealCeph, and an unreadable record on a real Ceph
// internal/backend/ceph's TestFormatRecordUnreadableIsAnError.

// fakeCephRecords is a Ceph connection's format records.
type fakeCephRecords struct {
	cfg     ceph.Config
	rec     *backend.FormatRecord
	readErr error
	closed  bool
}

func (f *fakeCephRecords) Format(context.Context, string) (backend.FormatRecord, bool, error) {
	if f.readErr != nil {
		return backend.FormatRecord{}, false, f.readErr
	}
	if f.rec == nil {
		return backend.FormatRecord{}, false, nil
	}
	return *f.rec, true, nil
}

func (f *fakeCephRecords) RecordFormat(_ context.Context, _, fsType string, at time.Time) error {
	if f.rec == nil {
		f.rec = &backend.FormatRecord{FSType: fsType, Time: at}
	}
	return nil
}

func (f *fakeCephRecords) Close() { f.closed = true }

// cephRecordsEnv is an agent whose ceph connections are recs (or fail
// with openErr), and vol-a, a ceph volume.
func cephRecordsEnv(t *testing.T, recs *fakeCephRecords, openErr error) (*Agent, *v1.Volume) {
	t.Helper()
	e := cephStageEnv(t, v1.MounterUserspace)
	e.cfg.CephRecords = func(_ context.Context, cfg ceph.Config, _ logr.Logger) (ceph.Records, error) {
		if openErr != nil {
			return nil, openErr
		}
		recs.cfg = cfg
		return recs, nil
	}
	a := newTestAgent(t, e.cfg)
	vol, err := a.readVolume(t.Context(), "vol-a")
	if err != nil {
		t.Fatal(err)
	}
	return a, vol
}

var stageSecrets = map[string]string{secretUserID: "berth", secretUserKey: testKey}

// A ceph volume's record is read with the stage's client from the pool
// its image is in, and a record found forbids a format.
func TestCephFormatRecordRead(t *testing.T) {
	recs := &fakeCephRecords{rec: &backend.FormatRecord{FSType: "xfs"}}
	a, vol := cephRecordsEnv(t, recs, nil)
	r, closeRecs, err := a.formatRecords(t.Context(), vol, cephCluster(), stageSecrets)
	if err != nil {
		t.Fatal(err)
	}
	p, err := a.formatPolicy(t.Context(), vol, r)
	if err != nil || !p.Never || !strings.Contains(p.Why, "its image records a xfs filesystem") {
		t.Fatalf("policy %+v, %v; want never, by the image's record", p, err)
	}
	closeRecs()
	if !recs.closed || recs.cfg.Pool != "rbd" || recs.cfg.Client != "berth" || recs.cfg.Key != testKey {
		t.Fatalf("connection closed %v, config %s; want closed, pool rbd, the stage's client", recs.closed, recs.cfg)
	}
}

// A record that cannot be read, or a connection that cannot be made, fails
// the stage: it is never taken for "not formatted".
func TestCephFormatRecordUnreadableFailsStage(t *testing.T) {
	timeout := fmt.Errorf("read format record of rbd/berth-vol-a: gave up waiting for ceph: %w", context.DeadlineExceeded)
	a, vol := cephRecordsEnv(t, &fakeCephRecords{readErr: timeout}, nil)
	r, closeRecs, err := a.formatRecords(t.Context(), vol, cephCluster(), stageSecrets)
	if err != nil {
		t.Fatal(err)
	}
	defer closeRecs()
	if p, err := a.formatPolicy(t.Context(), vol, r); !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "cannot be read") {
		t.Fatalf("policy %+v, %v; want the read error", p, err)
	}

	for _, c := range []struct {
		err  error
		want error
	}{
		{fmt.Errorf("connect: %w", ceph.ErrMonitorsUnreachable), volerr.ErrUnavailable},
		{fmt.Errorf("connect: %w", ceph.ErrAuthentication), volerr.ErrPrecondition},
		{ceph.ErrNotBuilt, volerr.ErrPrecondition},
	} {
		a, vol := cephRecordsEnv(t, nil, c.err)
		if _, _, err := a.formatRecords(t.Context(), vol, cephCluster(), stageSecrets); !errors.Is(err, c.want) || !errors.Is(err, c.err) {
			t.Errorf("open fails with %v: %v, want %v", c.err, err, c.want)
		}
	}

	// An image not named as the controller names it has no record there.
	a, vol = cephRecordsEnv(t, &fakeCephRecords{}, nil)
	vol.Status.Path = "rbd/other"
	if _, _, err := a.formatRecords(t.Context(), vol, cephCluster(), stageSecrets); !errors.Is(err, volerr.ErrPrecondition) {
		t.Errorf("image rbd/other: %v, want a precondition error", err)
	}
}

// A ceph volume's format is recorded on its image only: its Volume has no
// node, and the admission policy lets an agent write only its own node's.
func TestCephFormatRecordedOnImageNotStatus(t *testing.T) {
	recs := &fakeCephRecords{}
	a, vol := cephRecordsEnv(t, recs, nil)
	if err := a.recordFormat(t.Context(), vol, "ext4", recs); err != nil {
		t.Fatal(err)
	}
	if recs.rec == nil || recs.rec.FSType != "ext4" {
		t.Fatalf("image record %+v, want ext4", recs.rec)
	}
	got := &v1.Volume{}
	if err := a.api.Get(t.Context(), client.ObjectKey{Name: "vol-a"}, got); err != nil {
		t.Fatal(err)
	}
	if got.Status.Formatted != nil {
		t.Errorf("status.formatted %+v written on a node-less Volume", got.Status.Formatted)
	}
}
