package agent

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/berth-io/berth/internal/atomicfile"
)

// volumeRecord is what the agent keeps of a volume staged on this node: how
// its device reaches the kernel. It is one JSON file per volume,
// <userspace root>/_volumes/<volume>.json, for example
//
//	{"version":1,"transport":"nbd","serverPID":4242}
//
// written (atomically) before a stage makes anything and removed after an
// unstage undid everything, so the transport of a staged volume never
// depends on the agent's settings of the day.
type volumeRecord struct {
	Version   int       `json:"version"`
	Transport Transport `json:"transport"`
	// ServerPID is the volume's nbd or ublk server in this agent's PID
	// namespace: a hint, the server is recognised by its command line.
	ServerPID int `json:"serverPID,omitempty"`
	// UblkDevice is the number of the volume's ublk device (/dev/ublkbN),
	// which the kernel keeps while no server runs: a new server recovers
	// it. The device is checked by its tag (ublk.Tag) before any use.
	UblkDevice *uint32 `json:"ublkDevice,omitempty"`
	// Via is the userspace transport (fuse, nbd or ublk) under transport
	// rbd.
	Via Transport `json:"via,omitempty"`
	// Holders is the folder of the holder records of the volume's
	// StorageCluster when it runs in the netns mode: every server of the
	// volume, also one the healer starts after an agent restart, starts
	// in the namespace of the live holder found there.
	Holders string `json:"holders,omitempty"`
	// RBD is the POOL/IMAGE the kernel maps for transport krbd, and
	// RBDDevice its device (/dev/rbdN) once mapped.
	RBD       string `json:"rbd,omitempty"`
	RBDDevice *int   `json:"rbdDevice,omitempty"`
}

// recordVersion is the version this agent writes. Version 0 is the layout
// of agents before records (see load); an upgraded agent must find, heal
// and unstage the volumes they staged.
const recordVersion = 1

// recordsDir holds the records beside the volumes' mountpoints and server
// logs; '_' is in no volume name, so it never meets one of those.
const recordsDir = "_volumes"

// records are the agent's volume records under dir ("" when the agent
// serves no userspace volumes: every volume is then on a loop device, and
// nothing is written).
type records struct{ dir string }

func (a *Agent) records() records {
	if a.us == nil {
		return records{}
	}
	return records{dir: a.us.Root}
}

func (r records) path(volume string) string {
	return filepath.Join(r.dir, recordsDir, volume+".json")
}

// serverLog is the log of a volume's blockdev servers under root. Before
// records (version 0) it also marked a volume staged over FUSE.
func serverLog(root, volume string) string { return filepath.Join(root, volume+".log") }

// ioErrorsSuffix ends the file where a volume's servers count the requests
// its image failed (blockdev.IOErrors), beside its server log.
const ioErrorsSuffix = ".ioerrors"

func ioErrorsFile(root, volume string) string { return filepath.Join(root, volume+ioErrorsSuffix) }

// legacyNBD is the version 0 marker of a volume staged over nbd; it held
// the server's pid.
func (r records) legacyNBD(volume string) string { return filepath.Join(r.dir, volume+".nbd") }

// load returns the volume's record; found false (and transport loop) when
// it has none.
func (r records) load(volume string) (rec volumeRecord, found bool, err error) {
	none := volumeRecord{Version: recordVersion, Transport: TransportLoop}
	if r.dir == "" {
		return none, false, nil
	}
	b, err := os.ReadFile(r.path(volume))
	switch {
	case err == nil:
		if err := json.Unmarshal(b, &rec); err != nil {
			return none, false, fmt.Errorf("record of volume %s (%s): %w", volume, r.path(volume), err)
		}
		if rec.Version > recordVersion || rec.Transport == "" {
			return none, false, fmt.Errorf("record of volume %s (%s) is version %d with transport %q; this agent reads version %d and older: %w",
				volume, r.path(volume), rec.Version, rec.Transport, recordVersion, ErrUnsupported)
		}
		return rec, true, nil
	case !errors.Is(err, os.ErrNotExist):
		return none, false, fmt.Errorf("record of volume %s: %w", volume, err)
	}
	return r.loadLegacy(volume)
}

// loadLegacy reads the markers of version 0: <volume>.nbd (nbd, its
// content the server's pid) or else the server log <volume>.log (FUSE).
func (r records) loadLegacy(volume string) (volumeRecord, bool, error) {
	none := volumeRecord{Version: recordVersion, Transport: TransportLoop}
	b, err := os.ReadFile(r.legacyNBD(volume))
	if err == nil {
		pid, _ := strconv.Atoi(strings.TrimSpace(string(b))) // empty: written before the server started
		return volumeRecord{Version: 0, Transport: TransportNBD, ServerPID: pid}, true, nil
	}
	if !errors.Is(err, os.ErrNotExist) {
		return none, false, fmt.Errorf("nbd marker of volume %s: %w", volume, err)
	}
	if _, err := os.Stat(serverLog(r.dir, volume)); err == nil {
		return volumeRecord{Version: 0, Transport: TransportFUSE}, true, nil
	} else if !errors.Is(err, os.ErrNotExist) {
		return none, false, fmt.Errorf("server log of volume %s: %w", volume, err)
	}
	return none, false, nil
}

// list returns the volumes that have a record here, of either version, in
// name order: the volumes staged over a userspace transport on this node.
func (r records) list() ([]string, error) {
	if r.dir == "" {
		return nil, nil
	}
	names := map[string]bool{}
	for _, d := range []struct{ dir, suffix string }{
		{filepath.Join(r.dir, recordsDir), ".json"},
		{r.dir, ".nbd"},
		{r.dir, ".log"}, // version 0 FUSE marker; a version 1 volume has one too
	} {
		entries, err := os.ReadDir(d.dir)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("volume records: %w", err)
		}
		for _, e := range entries {
			if name, ok := strings.CutSuffix(e.Name(), d.suffix); ok && e.Type().IsRegular() && name != "" {
				names[name] = true
			}
		}
	}
	out := make([]string, 0, len(names))
	for n := range names {
		out = append(out, n)
	}
	slices.Sort(out)
	return out, nil
}

// save writes the volume's record in this agent's version; a version 0
// marker it replaces goes.
func (r records) save(volume string, rec volumeRecord) error {
	if r.dir == "" {
		return nil
	}
	rec.Version = recordVersion
	b, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Join(r.dir, recordsDir), 0o700); err != nil {
		return fmt.Errorf("record of volume %s: %w", volume, err)
	}
	if err := atomicfile.Write(r.path(volume), append(b, '\n'), 0o600); err != nil {
		return fmt.Errorf("record of volume %s: %w", volume, err)
	}
	if err := atomicfile.Remove(r.legacyNBD(volume)); err != nil {
		return fmt.Errorf("nbd marker of volume %s: %w", volume, err)
	}
	return nil
}

// create records transport t for a volume that has no record; made tells
// whether it wrote one.
func (r records) create(volume string, t Transport) (made bool, err error) {
	if r.dir == "" {
		return false, nil
	}
	if _, found, err := r.load(volume); err != nil || found {
		return false, err
	}
	return true, r.save(volume, volumeRecord{Transport: t})
}

// remove drops the volume's record, of either version, its I/O error count
// and the server log,
// which marked a FUSE volume in version 0: a log left behind would make a
// volume unstaged since look staged. Idempotent.
func (r records) remove(volume string) error {
	if r.dir == "" {
		return nil
	}
	for _, p := range []string{r.legacyNBD(volume), serverLog(r.dir, volume), ioErrorsFile(r.dir, volume), r.path(volume)} {
		if err := atomicfile.Remove(p); err != nil {
			return fmt.Errorf("remove record of volume %s: %w", volume, err)
		}
	}
	return nil
}
