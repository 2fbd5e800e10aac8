package agent

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestCheckRecordsRefusesNewerFormats: an agent that finds a record of a
// newer format than it reads (a rollback past a format change) refuses,
// naming each such record, and leaves every record where it was. The
// formats it reads (version 0 markers, version 1 records, freeze records
// of version 1), a record that does not parse, and missing folders pass.
func TestCheckRecordsRefusesNewerFormats(t *testing.T) {
	root, freeze := t.TempDir(), t.TempDir()
	write := func(path, content string) {
		t.Helper()
		if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	volumes, frozen := filepath.Join(root, recordsDir), filepath.Join(freeze, freezeRecordsDir)
	write(filepath.Join(root, "old-fuse.log"), "server log\n")
	write(filepath.Join(root, "old-nbd.nbd"), "4242\n")
	write(filepath.Join(volumes, "v1.json"), `{"version":1,"transport":"fuse"}`)
	write(filepath.Join(volumes, "broken.json"), `{"version":`)
	write(filepath.Join(frozen, "f1.json"), `{"version":1,"device":"/dev/loop3"}`)
	if err := CheckRecords(root, freeze); err != nil {
		t.Fatalf("records this agent reads: %v", err)
	}
	if err := CheckRecords("", ""); err != nil {
		t.Errorf("no folders: %v", err)
	}
	if err := CheckRecords(filepath.Join(root, "missing"), filepath.Join(freeze, "missing")); err != nil {
		t.Errorf("missing folders: %v", err)
	}

	write(filepath.Join(volumes, "v2.json"), `{"version":2,"transport":"fuse","somethingNew":true}`)
	write(filepath.Join(frozen, "f2.json"), `{"version":7,"device":"/dev/loop4"}`)
	err := CheckRecords(root, freeze)
	if !errors.Is(err, ErrNewerRecords) {
		t.Fatalf("newer records: %v, want ErrNewerRecords", err)
	}
	for _, want := range []string{"v2.json is version 2, this agent reads 1", "f2.json is version 7, this agent reads 1", "no volume was touched"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
	for _, p := range []string{"v1.json", "v2.json", "broken.json"} {
		if _, err := os.Stat(filepath.Join(volumes, p)); err != nil {
			t.Errorf("record %s after the check: %v", p, err)
		}
	}
	for _, p := range []string{"f1.json", "f2.json"} {
		if _, err := os.Stat(filepath.Join(frozen, p)); err != nil {
			t.Errorf("freeze record %s after the check: %v", p, err)
		}
	}
}
