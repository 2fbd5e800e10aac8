package mount

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"unicode"

	"k8s.io/utils/exec"

	"github.com/berth-io/berth/internal/volerr"
)

// ErrHoldsData: stage refused to format a device that shows no filesystem
// but may hold data (the volume was formatted before, is a copy, or its
// content is not blank).
var ErrHoldsData = volerr.New(volerr.ErrPrecondition, "refusing to format: the volume may hold data")

// FormatPolicy tells Stage whether a device on which blkid finds nothing
// may be formatted.
type FormatPolicy struct {
	// Never forbids mkfs: the volume held a filesystem before or is a copy
	// of a snapshot or a volume, so "nothing found" means a failed read or
	// damage, never a blank volume.
	Never bool
	// Why names the reason for Never, for the error.
	Why string
	// Image is the file behind Device when there is one (a local image); it
	// must read as all zeros for a format.
	Image string
}

// probe returns what blkid finds on dev (a filesystem or partition table
// type), "" when it finds nothing. Only blkid's exit code 2 means "nothing
// found"; every other failure is an error, never "blank". m.exec bounds it
// by the probe timeout (--probe-timeout): a dead server can hang a read.
func (m *Manager) probe(ctx context.Context, dev string) (string, error) {
	out, err := m.exec.CommandContext(ctx, "blkid", "-p", "-s", "TYPE", "-s", "PTTYPE", "-o", "export", dev).CombinedOutput()
	var exitErr exec.ExitError
	switch {
	case err == nil:
	case ctx.Err() != nil:
		return "", fmt.Errorf("probe %s: %w", dev, ctx.Err())
	case errors.As(err, &exitErr) && exitErr.Exited() && exitErr.ExitStatus() == 2:
		return "", nil
	default:
		return "", fmt.Errorf("probe %s: blkid: %w: %s", dev, err, strings.TrimSpace(string(out)))
	}
	return parseBlkidType(string(out)), nil
}

// parseBlkidType reads the filesystem or partition table type from the
// output of a blkid that found something (`-o export`); "unknown" when it
// names none: something is there all the same. blkid escapes blanks in
// export values, so a value with one is no type name (FuzzBlkidType).
func parseBlkidType(out string) string {
	for _, line := range strings.Split(out, "\n") {
		k, v, ok := strings.Cut(strings.TrimSpace(line), "=")
		if ok && v != "" && (k == "TYPE" || k == "PTTYPE") {
			if strings.IndexFunc(v, func(r rune) bool { return unicode.IsSpace(r) || unicode.IsControl(r) }) >= 0 {
				return "unknown"
			}
			return v
		}
	}
	return "unknown"
}

// allowFormat decides, before mount-utils runs, whether dev may be
// formatted, and opens the format gate for it only if so. It fails on any
// probe or read error. The caller closes the gate when staging ends. found
// is the filesystem type dev already holds ("" when blank).
func (m *Manager) allowFormat(ctx context.Context, r StageRequest) (found string, err error) {
	found, err = m.probe(ctx, r.Device)
	if err != nil {
		return "", err
	}
	if found != "" {
		m.log.V(1).Info("device holds a filesystem", "device", r.Device, "type", found)
		return found, nil // mount-utils mounts it; the gate keeps its own probe from formatting
	}
	if r.Format.Never {
		return "", fmt.Errorf("blkid finds no filesystem on %s, yet %s; a failed read or damage, not a blank volume: %w",
			r.Device, r.Format.Why, ErrHoldsData)
	}
	if r.ReadOnly {
		return "", nil // mount-utils refuses to format read-only
	}
	if err := m.blank(ctx, r.Device, r.Format.Image); err != nil {
		return "", err
	}
	m.gate.allow(r.Device)
	return "", nil
}
