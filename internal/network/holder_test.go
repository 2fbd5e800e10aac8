package network

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
)

// TestHolderPublishesAndWithdraws: the holder waits for its interface,
// publishes its record, puts it back if removed, and withdraws it when
// stopped.
func TestHolderPublishesAndWithdraws(t *testing.T) {
	st := newFakeStack()
	dir := Dir(filepath.Join(t.TempDir(), "holders"))
	id := NSID{Dev: 4, Ino: 4026532000}
	h := NewHolder(st, func() (NSID, error) { return id, nil }, dir, testr.New(t))
	h.Interval = 5 * time.Millisecond
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- h.Run(ctx, Record{PodUID: "pod-a", PodNamespace: "berth", PodName: "holder-x", Interface: "net1"})
	}()
	time.Sleep(30 * time.Millisecond)
	if recs, _ := dir.List(); len(recs) != 0 {
		t.Fatalf("record published before the interface exists: %v", recs)
	}
	st.add(Link{Name: "net1", Kind: "macvlan"}, nil, nil)
	var rec Record
	waitFor(t, "record", func() bool {
		var err error
		rec, err = dir.Read("pod-a")
		return err == nil
	})
	if rec.NetNS != id || rec.PID != os.Getpid() || rec.Interface != "net1" || rec.PodName != "holder-x" {
		t.Errorf("record %+v", rec)
	}
	if err := dir.Remove("pod-a"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "record put back", func() bool { _, err := dir.Read("pod-a"); return err == nil })
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if _, err := dir.Read("pod-a"); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("record after stop: %v, want withdrawn", err)
	}
}

func TestDirListSkipsBadRecords(t *testing.T) {
	dir := Dir(t.TempDir())
	good := Record{PodUID: "pod-a", Interface: "net1", NetNS: NSID{Ino: 7}}
	if err := dir.Write(good); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(string(dir), "pod-b.json"), []byte("{"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := dir.Write(Record{PodUID: "../x", Interface: "net1", NetNS: NSID{Ino: 7}}); err == nil {
		t.Error("a pod UID with a path in it was written")
	}
	if err := dir.Write(Record{PodUID: "pod-c", Interface: "a-name-far-too-long", NetNS: NSID{Ino: 7}}); err == nil {
		t.Error("an interface name over 15 characters was written")
	}
	recs, err := dir.List()
	if len(recs) != 1 || recs[0] != good {
		t.Errorf("List = %v", recs)
	}
	if err == nil {
		t.Error("List hid the unreadable record")
	}
	if recs, err := Dir(filepath.Join(string(dir), "none")).List(); len(recs) != 0 || err != nil {
		t.Errorf("missing folder: %v, %v", recs, err)
	}
}
