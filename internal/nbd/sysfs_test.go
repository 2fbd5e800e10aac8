package nbd

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

func itoa(i int) string { return strconv.Itoa(i) }

func TestFindByBackend(t *testing.T) {
	sysfs := t.TempDir()
	if _, found, err := FindByBackend(sysfs, "berth:a"); err != nil || found {
		t.Fatalf("empty sysfs: found %v, %v", found, err)
	}
	writeBackend(t, sysfs, 0, "berth:other")
	writeBackend(t, sysfs, 12, BackendID("n1", "vol-a"))
	// A device without a backend file, and a prefix of the id.
	if err := os.MkdirAll(filepath.Join(sysfs, "block", "nbd3"), 0o755); err != nil {
		t.Fatal(err)
	}
	writeBackend(t, sysfs, 5, BackendID("n1", "vol"))
	// Not an nbd index.
	if err := os.MkdirAll(filepath.Join(sysfs, "block", "nbdx"), 0o755); err != nil {
		t.Fatal(err)
	}
	idx, found, err := FindByBackend(sysfs, BackendID("n1", "vol-a"))
	if err != nil || !found || idx != 12 {
		t.Fatalf("got %d %v %v, want nbd12", idx, found, err)
	}
	if _, found, _ := FindByBackend(sysfs, BackendID("n1", "vol-b")); found {
		t.Fatal("found a volume that has no device")
	}
}

func TestNames(t *testing.T) {
	if BackendID("n1", "pvc-1") != "berth:n1/pvc-1" || BackendID("", "pvc-1") != "berth:pvc-1" || DevicePath(4) != "/dev/nbd4" {
		t.Fatal(BackendID("n1", "pvc-1"), DevicePath(4))
	}
}

func TestAvailable(t *testing.T) {
	sysfs := t.TempDir()
	ok, reason := Available(sysfs)
	if ok || !strings.Contains(reason, filepath.Join(sysfs, "module", "nbd")) || !strings.Contains(reason, "modprobe nbd") {
		t.Fatalf("without module: %v %q", ok, reason)
	}
	if err := os.MkdirAll(filepath.Join(sysfs, "module", "nbd"), 0o755); err != nil {
		t.Fatal(err)
	}
	if ok, reason := Available(sysfs); !ok {
		t.Fatalf("with module: %q", reason)
	}
}
