package mount

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"k8s.io/utils/exec"
)

// TestRootRecordedVolumeNeverFormatted: a formatted volume whose superblock
// region no longer probes (blkid finds nothing, as after a failed read) is
// refused, both when its format is recorded and, unrecorded, because its
// image holds data; its data stays intact. Today's main reformats it.
func TestRootRecordedVolumeNeverFormatted(t *testing.T) {
	e := newRootEnv(t)
	img := e.image(t, "vol", 64*mib)
	req := e.stage(t, img, StageRequest{VolumeID: "v", Format: FormatPolicy{Image: img}})
	dev, staging := req.Device, req.StagingPath
	want := bytes.Repeat([]byte("berth keeps this "), 1000)
	if err := os.WriteFile(filepath.Join(staging, "data"), want, 0o644); err != nil {
		t.Fatal(err)
	}
	e.unstage(t, staging)

	// Wipe the ext4 magic (2 bytes at 0x438): blkid now finds nothing.
	magic := make([]byte, 2)
	readDev(t, dev, magic, 0x438)
	if out, err := exec.New().Command("wipefs", "-a", dev).CombinedOutput(); err != nil {
		t.Fatalf("wipefs: %v %s", err, out)
	}
	if fs, err := e.mgr.probe(e.ctx, dev); err != nil || fs != "" {
		t.Fatalf("probe after wipefs: %q %v, want nothing found", fs, err)
	}

	recorded := req
	recorded.Format.Never, recorded.Format.Why = true, "its image records an ext4 filesystem"
	if err := e.mgr.Stage(e.ctx, recorded); !errors.Is(err, ErrHoldsData) {
		t.Fatalf("stage of a recorded volume that probes blank: %v, want ErrHoldsData", err)
	}
	if err := e.mgr.Stage(e.ctx, req); !errors.Is(err, ErrHoldsData) {
		t.Fatalf("stage of an unrecorded volume whose image holds data: %v, want ErrHoldsData", err)
	}
	if n := mountsOf(t, dev); n != 0 {
		t.Fatalf("%d mounts after refused stages", n)
	}

	// Put the magic back: the filesystem and the file are as they were.
	f, err := os.OpenFile(dev, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt(magic, 0x438); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.New().Command("e2fsck", "-fn", dev).CombinedOutput(); err != nil {
		t.Fatalf("e2fsck after the refused stages: %v\n%s", err, out)
	}
	if err := e.mgr.Stage(e.ctx, recorded); err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(filepath.Join(staging, "data"))
	if err != nil || !bytes.Equal(got, want) {
		t.Fatalf("data after the refused stages: %d bytes, %v; want the %d written", len(got), err, len(want))
	}
}

// TestRootBlankCheckReadsTheDevice: the blank check reads the real device;
// a fresh sparse image and its loop device pass.
func TestRootBlankCheckReadsTheDevice(t *testing.T) {
	e := newRootEnv(t)
	img := e.image(t, "vol", 64*mib)
	dev := e.attach(t, img)
	if err := checkBlank(e.ctx, dev, img); err != nil {
		t.Fatalf("fresh volume: %v", err)
	}
	f, err := os.OpenFile(dev, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte("LVM2"), 64*mib-4096); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	if err := checkBlank(e.ctx, dev, ""); !errors.Is(err, ErrHoldsData) {
		t.Fatalf("device with data at its end: %v, want ErrHoldsData", err)
	}
}

func readDev(t *testing.T, dev string, b []byte, off int64) {
	t.Helper()
	f, err := os.Open(dev)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = f.Close() }()
	if _, err := f.ReadAt(b, off); err != nil {
		t.Fatal(err)
	}
}
