package agent

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// ErrNewerRecords says that a node's records were written by an agent of a newer
// record format than this one reads (a rollback past a format change, or
// an upgrade to a release that dropped an old reader).
var ErrNewerRecords = errors.New("records of a newer format than this agent reads")

// CheckRecords reads the version of every record the agent keeps on this
// node, the userspace volumes' under userspaceRoot and the freeze records
// under freezeDir, and refuses with ErrNewerRecords, naming each, when one
// is of a format this agent cannot read. It runs at agent start before
// anything else: healing, cleaning up or unstaging a volume whose record
// was misread could cut a live device or leave a filesystem frozen. A
// record that does not parse at all is not this check's: the operation on
// its volume reports it. Either folder may be "" or missing.
func CheckRecords(userspaceRoot, freezeDir string) error {
	var newer []string
	r := records{dir: userspaceRoot}
	volumes, err := r.list()
	if err != nil {
		return err
	}
	for _, v := range volumes {
		if line, err := newerRecord(r.path(v), recordVersion); err != nil {
			return err
		} else if line != "" {
			newer = append(newer, line)
		}
	}
	if freezeDir != "" {
		dir := filepath.Join(freezeDir, freezeRecordsDir)
		entries, err := os.ReadDir(dir)
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("freeze records: %w", err)
		}
		for _, e := range entries {
			if !strings.HasSuffix(e.Name(), ".json") || !e.Type().IsRegular() {
				continue
			}
			if line, err := newerRecord(filepath.Join(dir, e.Name()), freezeRecordVersion); err != nil {
				return err
			} else if line != "" {
				newer = append(newer, line)
			}
		}
	}
	if len(newer) == 0 {
		return nil
	}
	return fmt.Errorf("%w: %s; no volume was touched: run the release that wrote them (or a newer one), "+
		"and let it unstage those volumes before going back to this one", ErrNewerRecords, strings.Join(newer, "; "))
}

// newerRecord reads the version of the record at path and says, when it is
// beyond max, which record and version it is. A missing file (a version 0
// volume, which has only markers) or one that does not parse says nothing.
func newerRecord(path string, max int) (string, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("record %s: %w", path, err)
	}
	var v struct {
		Version int `json:"version"`
	}
	// One that does not parse is left to the operation on its volume.
	parsed := json.Unmarshal(b, &v) == nil
	if !parsed || v.Version <= max {
		return "", nil
	}
	return fmt.Sprintf("%s is version %d, this agent reads %d and older", path, v.Version, max), nil
}
