package agent

import (
	"errors"
	"os"
	"testing"
	"time"

	testingexec "k8s.io/utils/exec/testing"
	"sigs.k8s.io/controller-runtime/pkg/client"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1 "github.com/berth-io/berth/api/v1alpha1"
	"github.com/berth-io/berth/internal/backend"
	"github.com/berth-io/berth/internal/mount"
)

// Unit tests of the format decision with a scripted blkid; the real one
// (loop devices, mkfs) is internal/mount's TestRootRecordedVolumeNeverFormatted.

var (
	nothingFound = command("blkid", &testingexec.FakeExitError{Status: 2})
	probeFails   = command("blkid", &testingexec.FakeExitError{Status: 4})
)

// TestFakeStageNeverFormatsRecordedOrCopied: when blkid finds nothing on a
// volume that was formatted before or is a copy, stage fails and runs no
// mkfs (today's main formats it).
func TestFakeStageNeverFormatsRecordedOrCopied(t *testing.T) {
	for name, edit := range map[string]func(*v1.Volume){
		"status records a format": func(v *v1.Volume) {
			v.Status.Formatted = &v1.VolumeFormat{FSType: "ext4", Time: metav1.Now()}
		},
		"copy of a snapshot":     func(v *v1.Volume) { v.Spec.Source = &v1.VolumeSource{Snapshot: "snap-1"} },
		"clone of a volume":      func(v *v1.Volume) { v.Spec.Source = &v1.VolumeSource{Volume: "vol-b"} },
		"image records a format": func(*v1.Volume) {},
	} {
		t.Run(name, func(t *testing.T) {
			// mkfs is scripted so that today's code, which runs it, fails
			// this test on the checks rather than on a missing script.
			e := newStageEnvOf(t, false, edit, nothingFound, nothingFound, command("mkfs.ext4", nil))
			if name == "image records a format" {
				*e.images.formatted = backend.FormatRecord{FSType: "ext4", Time: time.Now()}
			}
			e.refused(t, mount.ErrHoldsData, 1) // blkid only
		})
	}
}

// TestFakeStageProbeFailureIsNotBlank: a probe that fails, or a device that
// cannot be read or holds data blkid does not name, fails stage: no mkfs.
func TestFakeStageProbeFailureIsNotBlank(t *testing.T) {
	for _, c := range []struct {
		name  string
		probe testingexec.FakeCommandAction
		edit  func(t *testing.T, e *stageEnv)
		// want is the error (nil: any but ErrHoldsData).
		want error
	}{
		{"blkid fails", probeFails, func(*testing.T, *stageEnv) {}, nil},
		{"device unreadable", nothingFound, func(t *testing.T, e *stageEnv) { e.loop.dev = t.TempDir() }, nil}, // a read gives EISDIR
		{"image holds data", nothingFound, func(t *testing.T, e *stageEnv) { writeAt(t, e.images.path, 3<<20, "a user's file") }, mount.ErrHoldsData},
		{"device end holds data", nothingFound, func(t *testing.T, e *stageEnv) { writeAt(t, e.loop.dev, 4<<20-512, "md 1.0 superblock") }, mount.ErrHoldsData},
	} {
		t.Run(c.name, func(t *testing.T) {
			e := newStageEnv(t, false, c.probe, nothingFound, command("mkfs.ext4", nil))
			c.edit(t, e)
			if err := e.refused(t, c.want, 1); c.want == nil && errors.Is(err, mount.ErrHoldsData) { // blkid only
				t.Errorf("stage: %v, want a probe or read error", err)
			}
		})
	}
}

// TestFakeStageRecordsFormat: a stage that made a filesystem records it on
// the image and in the Volume's status.
func TestFakeStageRecordsFormat(t *testing.T) {
	e := newStageEnv(t, false, nothingFound, nothingFound, command("mkfs.ext4", nil))
	if err := e.stage(t); err != nil {
		t.Fatal(err)
	}
	if e.images.formatted.FSType != "ext4" {
		t.Errorf("image record %+v, want ext4", *e.images.formatted)
	}
	vol := &v1.Volume{}
	if err := e.api.Get(t.Context(), client.ObjectKey{Name: "vol-a"}, vol); err != nil {
		t.Fatal(err)
	}
	if f := vol.Status.Formatted; f == nil || f.FSType != "ext4" || !f.Time.Equal(&metav1.Time{Time: time.Date(2026, 11, 23, 2, 0, 0, 0, time.UTC)}) {
		t.Errorf("status.formatted %+v, want ext4 at the clock's time", f)
	}
}

func writeAt(t *testing.T, path string, off int64, s string) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = f.Close() }()
	if _, err := f.WriteAt([]byte(s), off); err != nil {
		t.Fatal(err)
	}
}
