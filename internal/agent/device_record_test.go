package agent

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// TestRecordVersions: a record is written in this agent's version, and
// the markers of agents before records (version 0) are still read: an
// upgraded agent finds the volumes they staged.
func TestRecordVersions(t *testing.T) {
	r := records{dir: t.TempDir()}
	load := func(volume string) (volumeRecord, bool) {
		t.Helper()
		rec, found, err := r.load(volume)
		if err != nil {
			t.Fatal(err)
		}
		return rec, found
	}
	if rec, found := load("none"); found || rec.Transport != TransportLoop {
		t.Errorf("no record: %+v, %t; want loop, not found", rec, found)
	}
	write := func(name, content string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(r.dir, name), []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("old-fuse.log", "server log\n")
	write("old-nbd.log", "server log\n")
	write("old-nbd.nbd", "4242\n")
	write("old-nbd-early.nbd", "")
	for volume, want := range map[string]volumeRecord{
		"old-fuse":      {Version: 0, Transport: TransportFUSE},
		"old-nbd":       {Version: 0, Transport: TransportNBD, ServerPID: 4242},
		"old-nbd-early": {Version: 0, Transport: TransportNBD},
	} {
		if rec, found := load(volume); !found || rec != want {
			t.Errorf("%s: %+v, %t; want %+v", volume, rec, found, want)
		}
	}
	// A new record replaces the old marker.
	if err := r.save("old-nbd", volumeRecord{Transport: TransportNBD, ServerPID: 7}); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(r.path("old-nbd"))
	if err != nil {
		t.Fatal(err)
	}
	if string(b) != `{"version":1,"transport":"nbd","serverPID":7}`+"\n" {
		t.Errorf("record = %s", b)
	}
	if _, err := os.Stat(r.legacyNBD("old-nbd")); !os.IsNotExist(err) {
		t.Errorf("old nbd marker left beside the new record: %v", err)
	}
	if made, err := r.create("old-fuse", TransportNBD); err != nil || made {
		t.Errorf("create over an old record: %t, %v; want it kept", made, err)
	}
	if made, err := r.create("new", TransportLoop); err != nil || !made {
		t.Errorf("create: %t, %v", made, err)
	}
	if rec, found := load("new"); !found || rec != (volumeRecord{Version: 1, Transport: TransportLoop}) {
		t.Errorf("new: %+v, %t", rec, found)
	}
	for _, v := range []string{"old-nbd", "old-nbd-early", "new"} {
		if err := r.remove(v); err != nil {
			t.Fatal(err)
		}
		if _, found := load(v); found {
			t.Errorf("%s: record left after remove", v)
		}
	}
	// A record of a newer agent is refused, not taken for a loop volume.
	write(filepath.Join(recordsDir, "future.json"), `{"version":2,"transport":"rbd"}`)
	if _, _, err := r.load("future"); !errors.Is(err, ErrUnsupported) {
		t.Errorf("newer record: %v, want ErrUnsupported", err)
	}
	// Without a userspace root nothing is written and every volume is on a loop device.
	if made, err := (records{}).create("x", TransportLoop); err != nil || made {
		t.Errorf("create without a root: %t, %v", made, err)
	}
}

// TestRecordsList: the volumes with a record of either version, once each,
// in name order; nothing else in the folder counts.
func TestRecordsList(t *testing.T) {
	dir := t.TempDir()
	r := records{dir: dir}
	if got, err := r.list(); err != nil || len(got) != 0 {
		t.Fatalf("list of an empty root = %v, %v", got, err)
	}
	if err := r.save("vol-b", volumeRecord{Transport: TransportFUSE}); err != nil {
		t.Fatal(err)
	}
	for name, body := range map[string]string{
		"vol-b.log": "", // a version 1 volume's server log
		"vol-a.nbd": "42\n",
		"vol-c.log": "", // version 0 FUSE marker
	} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Mkdir(filepath.Join(dir, "vol-d"), 0o700); err != nil { // a mountpoint
		t.Fatal(err)
	}
	got, err := r.list()
	if err != nil || !slices.Equal(got, []string{"vol-a", "vol-b", "vol-c"}) {
		t.Fatalf("list = %v, %v; want vol-a vol-b vol-c", got, err)
	}
	if got, err := (records{}).list(); err != nil || got != nil {
		t.Errorf("list without a userspace root = %v, %v", got, err)
	}
}
