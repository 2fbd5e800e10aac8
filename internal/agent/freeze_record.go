package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/berth-io/berth/internal/atomicfile"
	"github.com/berth-io/berth/internal/mount"
)

// freezeRecord says that this node's agent froze a volume's filesystem for
// a copy. A kernel freeze outlives the process that made it, so the record
// is written before FIFREEZE and removed after the thaw: an agent that died
// in between left it, and the next agent thaws at start (ThawLeftovers).
// Records, not a FITHAW on every staged mount, decide what start thaws:
// a freeze berth did not make (a backup hook's fsfreeze in the pod) is left
// alone, and an RWX volume's filesystem, mounted only in its share
// manager's pod, is found through the device and fs type recorded here.
// It is one JSON file per volume, <freeze dir>/_frozen/<volume>.json:
//
//	{"version":1,"device":"/dev/loop3"}
//	{"version":1,"device":"/dev/loop4","fsType":"ext4","scratch":"/run/berth/freeze/berth-freeze-pvc-1"}
type freezeRecord struct {
	Version int    `json:"version"`
	Device  string `json:"device"`
	// Scratch is set for a freeze through a mount of its own there
	// (mount.Manager.FreezeElsewhere), FSType when known ("": mount(8)
	// finds it).
	FSType  string `json:"fsType,omitempty"`
	Scratch string `json:"scratch,omitempty"`
}

const freezeRecordsDir = "_frozen"

// freezeRecordVersion is the version of the freeze records this agent
// writes and reads (CheckRecords refuses a newer one at start).
const freezeRecordVersion = 1

// freezeRoot holds the scratch mounts and the freeze records.
func (a *Agent) freezeRoot() string {
	if a.freezeDir == "" {
		return os.TempDir()
	}
	return a.freezeDir
}

// freezeScratch is where a volume's filesystem is mounted a moment to
// freeze or thaw it when no mount of it is in sight.
func (a *Agent) freezeScratch(volume string) string {
	return filepath.Join(a.freezeRoot(), "berth-freeze-"+volume)
}

func (a *Agent) freezeRecordPath(volume string) string {
	return filepath.Join(a.freezeRoot(), freezeRecordsDir, volume+".json")
}

func (a *Agent) writeFreezeRecord(volume string, rec freezeRecord) error {
	rec.Version = freezeRecordVersion
	b, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	p := a.freezeRecordPath(volume)
	if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
		return fmt.Errorf("freeze record of volume %s: %w", volume, err)
	}
	if err := atomicfile.Write(p, b, 0o600); err != nil {
		return fmt.Errorf("freeze record of volume %s: %w", volume, err)
	}
	return nil
}

func (a *Agent) removeFreezeRecord(volume string) {
	if err := atomicfile.Remove(a.freezeRecordPath(volume)); err != nil && !errors.Is(err, os.ErrNotExist) {
		// Harmless but for noise: the next start's FITHAW finds it not frozen.
		a.log.Error(err, "remove freeze record", "volume", volume)
	}
}

// ThawLeftovers thaws every filesystem that an earlier agent froze for a
// copy and never thawed (it died meanwhile), so that its writers and
// kubelet's unmounts stop waiting. Call it at start, before anything may
// freeze. A record whose filesystem is not frozen (the agent died just
// before FIFREEZE or just after the thaw) is dropped. It returns how many
// filesystems it thawed; a record it cannot work off stays for the next
// start.
func (a *Agent) ThawLeftovers(ctx context.Context) (int, error) {
	dir := filepath.Join(a.freezeRoot(), freezeRecordsDir)
	entries, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("freeze records: %w", err)
	}
	thawed := 0
	var errs []error
	for _, e := range entries {
		volume, ok := strings.CutSuffix(e.Name(), ".json")
		if !ok || !e.Type().IsRegular() {
			continue
		}
		was, err := a.thawRecorded(ctx, volume)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if was {
			thawed++
			a.log.Info("thawed a filesystem that an earlier agent left frozen", "volume", volume)
		}
		a.removeFreezeRecord(volume)
	}
	return thawed, errors.Join(errs...)
}

func (a *Agent) thawRecorded(ctx context.Context, volume string) (bool, error) {
	b, err := os.ReadFile(a.freezeRecordPath(volume))
	if err != nil {
		return false, fmt.Errorf("freeze record of volume %s: %w", volume, err)
	}
	var rec freezeRecord
	if err := json.Unmarshal(b, &rec); err != nil {
		return false, fmt.Errorf("freeze record of volume %s: %w", volume, err)
	}
	if rec.Version > freezeRecordVersion {
		return false, fmt.Errorf("freeze record of volume %s is version %d, this agent reads %d: %w", volume, rec.Version, freezeRecordVersion, ErrNewerRecords)
	}
	if !filepath.IsAbs(rec.Device) || (rec.Scratch != "" && !filepath.IsAbs(rec.Scratch)) {
		return false, fmt.Errorf("freeze record of volume %s names device %q, scratch %q: want absolute paths", volume, rec.Device, rec.Scratch)
	}
	if rec.Scratch == "" {
		was, err := a.mounts.Thaw(ctx, rec.Device)
		if !errors.Is(err, mount.ErrNotFound) {
			if err != nil {
				return false, fmt.Errorf("thaw volume %s: %w", volume, err)
			}
			return was, nil
		}
		// Unmounted since: a frozen filesystem outlives its last mount
		// (the kernel keeps its superblock while frozen), and the next
		// mount of the device would find it frozen still.
		rec.Scratch = a.freezeScratch(volume)
	}
	was, err := a.mounts.ThawElsewhere(ctx, rec.Device, rec.FSType, rec.Scratch)
	if err != nil {
		return false, fmt.Errorf("thaw volume %s: %w", volume, err)
	}
	return was, nil
}
