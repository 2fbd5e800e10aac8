package atomicfile

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestWriteReplacesWholeAndLeavesNoTemp(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "record")
	for _, want := range []string{"first\n", "second, longer\n", ""} {
		if err := Write(p, []byte(want), 0o600); err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		if string(got) != want {
			t.Fatalf("read %q, wrote %q", got, want)
		}
	}
	fi, err := os.Stat(p)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("mode %v, want 0600", fi.Mode().Perm())
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(ents) != 1 {
		t.Errorf("dir holds %v, want only the record", ents)
	}
}

func TestWriteFailureKeepsOldContent(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "record")
	if err := Write(p, []byte("old"), 0o600); err != nil {
		t.Fatal(err)
	}
	// A dir in the way of the rename makes the write fail at its last step.
	blocked := filepath.Join(dir, "sub")
	if err := os.MkdirAll(filepath.Join(blocked, "x"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := Write(blocked, []byte("new"), 0o600); err == nil {
		t.Fatal("write over a non-empty dir succeeded")
	}
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		if strings.Contains(e.Name(), ".tmp-") {
			t.Errorf("failed write left %s", e.Name())
		}
	}
	if got, _ := os.ReadFile(p); string(got) != "old" {
		t.Errorf("record reads %q after another file's failed write", got)
	}
}

func TestRemove(t *testing.T) {
	p := filepath.Join(t.TempDir(), "record")
	if err := Write(p, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	for range 2 { // the second finds nothing: no error
		if err := Remove(p); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := os.Stat(p); !os.IsNotExist(err) {
		t.Errorf("record still there: %v", err)
	}
}
