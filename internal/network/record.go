package network

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"

	"github.com/berth-io/berth/internal/atomicfile"
)

// NSID identifies a network namespace for as long as it lives: the device
// and inode of its nsfs file (what stat of /proc/<pid>/ns/net returns).
type NSID struct {
	Dev uint64 `json:"dev"`
	Ino uint64 `json:"ino"`
}

// Record is what a holder publishes for the mover.
type Record struct {
	PodUID       string `json:"podUID"`
	PodNamespace string `json:"podNamespace,omitempty"`
	PodName      string `json:"podName,omitempty"`
	// Interface is the storage network interface in the holder's namespace.
	Interface string `json:"interface"`
	// PID is the holder's PID in its own PID namespace: a hint that is right
	// only where the holder shares the mover's PID namespace.
	PID   int  `json:"pid"`
	NetNS NSID `json:"netns"`
}

// podUIDPattern keeps a record's file name a plain name: the UID comes from
// a flag and becomes a path.
var podUIDPattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9-]{0,62}$`)

func (r Record) validate() error {
	if !podUIDPattern.MatchString(r.PodUID) {
		return fmt.Errorf("holder record: pod UID %q is not a UID", r.PodUID)
	}
	if r.Interface == "" || len(r.Interface) > 15 || strings.ContainsAny(r.Interface, "/ \x00") {
		return fmt.Errorf("holder record %s: interface name %q is not an interface name", r.PodUID, r.Interface)
	}
	if r.NetNS.Ino == 0 {
		return fmt.Errorf("holder record %s: no network namespace", r.PodUID)
	}
	return nil
}

// Records is where holders publish themselves.
type Records interface {
	List() ([]Record, error)
}

// DefaultDir is the holders' folder on each node.
const DefaultDir = "/var/lib/berth/network/holders"

// Dir keeps one record file per holder in a folder shared by the holders
// and the mover of a node (a hostPath).
type Dir string

const recordSuffix = ".json"

func (d Dir) path(podUID string) string {
	return filepath.Join(string(d), podUID+recordSuffix)
}

// Write publishes r, replacing the record of the same pod.
func (d Dir) Write(r Record) error {
	if err := r.validate(); err != nil {
		return err
	}
	data, err := json.Marshal(r)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(string(d), 0o755); err != nil {
		return fmt.Errorf("holder records: %w", err)
	}
	return atomicfile.Write(d.path(r.PodUID), data, 0o644)
}

// Read returns the record of a pod. A file speaks only for the pod it is
// named after: a holder could otherwise write a record in another pod's
// name, which the mover would act on as that pod's.
func (d Dir) Read(podUID string) (Record, error) {
	var r Record
	if !podUIDPattern.MatchString(podUID) {
		return r, fmt.Errorf("holder record: pod UID %q is not a UID", podUID)
	}
	data, err := os.ReadFile(d.path(podUID))
	if err != nil {
		return r, err
	}
	if err := json.Unmarshal(data, &r); err != nil {
		return r, fmt.Errorf("holder record %s: %w", d.path(podUID), err)
	}
	if r.PodUID != podUID {
		return Record{}, fmt.Errorf("holder record %s names pod %q", d.path(podUID), r.PodUID)
	}
	return r, r.validate()
}

// Remove withdraws a pod's record; a missing one is no error.
func (d Dir) Remove(podUID string) error {
	if !podUIDPattern.MatchString(podUID) {
		return fmt.Errorf("holder record: pod UID %q is not a UID", podUID)
	}
	return atomicfile.Remove(d.path(podUID))
}

// List returns the valid records, sorted by pod UID. A missing folder holds
// none; a file that does not parse is skipped with an error that names it,
// and the rest are still returned, so that one bad file never stops the
// mover from serving the other holders.
func (d Dir) List() ([]Record, error) {
	entries, err := os.ReadDir(string(d))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("holder records: %w", err)
	}
	var recs []Record
	var errs []error
	for _, e := range entries {
		name := e.Name()
		if !e.Type().IsRegular() || !strings.HasSuffix(name, recordSuffix) || strings.HasPrefix(name, ".") {
			continue
		}
		r, err := d.Read(strings.TrimSuffix(name, recordSuffix))
		if err != nil {
			if !errors.Is(err, os.ErrNotExist) {
				errs = append(errs, err)
			}
			continue
		}
		recs = append(recs, r)
	}
	sort.Slice(recs, func(i, j int) bool { return recs[i].PodUID < recs[j].PodUID })
	return recs, errors.Join(errs...)
}
