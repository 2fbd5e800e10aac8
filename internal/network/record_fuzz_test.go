package network

import (
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
)

// FuzzHolderRecord: the mover trusts what it reads from the holders'
// folder, which pods write. Whatever bytes a file <name>.json holds, a
// record Read or List returns is valid, belongs to the pod its file is
// named after, and survives a Write and Read unchanged; List returns each
// pod once, sorted. Seeds are records as a holder writes them (the netns
// dev and inode of a real network namespace).
func FuzzHolderRecord(f *testing.F) {
	for _, s := range []struct{ name, data string }{
		{"0b5e4c1a-9d2f-4a61-8c3e-5f7a1b2c3d4e", `{"podUID":"0b5e4c1a-9d2f-4a61-8c3e-5f7a1b2c3d4e","podNamespace":"berth-system","podName":"berth-holder-x7k2p","interface":"net1","pid":1,"netns":{"dev":4,"ino":4026531833}}`},
		{"pod-a", `{"podUID":"pod-a","interface":"net1","pid":4242,"netns":{"dev":4,"ino":4026532456}}`},
		{"pod-a", `{"podUID":"pod-b","interface":"net1","pid":4242,"netns":{"dev":4,"ino":4026532456}}`},
		{"pod-a", `{"podUID":"pod-a","interface":"../../x","netns":{"dev":4,"ino":1}}`},
		{"pod-a", `{"podUID":"pod-a","interface":"net1","netns":{"dev":4,"ino":0}}`},
		{"pod-a", `not json`},
	} {
		f.Add(s.name, []byte(s.data))
	}
	f.Fuzz(func(t *testing.T, name string, data []byte) {
		if name == "" || name != filepath.Base(name) || name == "." || name == ".." {
			return // not a file name in the folder
		}
		d := Dir(t.TempDir())
		if err := os.WriteFile(d.path(name), data, 0o644); err != nil {
			return // a name the filesystem refuses
		}
		if r, err := d.Read(name); err == nil {
			if err := r.validate(); err != nil {
				t.Fatalf("Read(%q) returned an invalid record: %v", name, err)
			}
			if r.PodUID != name {
				t.Fatalf("Read(%q) returned the record of pod %q: a file speaks for another holder", name, r.PodUID)
			}
			back := Dir(t.TempDir())
			if err := back.Write(r); err != nil {
				t.Fatalf("Write of a record Read returned: %v", err)
			}
			if again, err := back.Read(r.PodUID); err != nil || !reflect.DeepEqual(again, r) {
				t.Fatalf("round trip of %+v: %+v, %v", r, again, err)
			}
		}
		recs, _ := d.List()
		if !slices.IsSortedFunc(recs, func(a, b Record) int { return strings.Compare(a.PodUID, b.PodUID) }) {
			t.Fatalf("List not sorted: %+v", recs)
		}
		for i, r := range recs {
			if r.validate() != nil || (i > 0 && recs[i-1].PodUID == r.PodUID) {
				t.Fatalf("List returned %+v", recs)
			}
		}
	})
}
