package backend

import (
	"context"
	"fmt"
	"os"

	"github.com/berth-io/berth/internal/volerr"
)

// ErrSourceInUse: a volume cannot be copied consistently now (it is staged
// without a filesystem to freeze, and the data dir cannot reflink).
var ErrSourceInUse = volerr.New(volerr.ErrInUse, "source volume is in use and cannot be copied consistently")

// Quiescer holds a volume's image still while it is copied into a snapshot
// or a clone. The agent is one: it takes the volume's lock and freezes the
// filesystem staged on it.
type Quiescer interface {
	Quiesce(ctx context.Context, volumeID string) (Hold, error)
}

// Hold is a Quiescer's hold on a volume.
type Hold struct {
	// Stable: nothing writes the image while the hold lasts (the volume is
	// not staged, or its filesystem is frozen), so a chunked copy is a
	// point-in-time copy. Otherwise only a reflink copy, atomic, may run.
	Stable bool
	// Ctx ends when the hold's time limit passes: writers wait on a frozen
	// filesystem, so the copy must end by then or fail.
	Ctx context.Context
	// Release ends the hold (thaws); called once, however the copy ended.
	Release func()
}

// WithQuiescer makes every copy of a volume hold it still through q.
// Without one, copies run as they are (nothing staged them: tests, tools).
func (l *Local) WithQuiescer(q Quiescer) *Local {
	l.quiescer = q
	return l
}

// copyFrom fills dst with the image at srcPath. The image of a volume
// (volumeID set; a snapshot's never changes) is held still for the copy.
func (l *Local) copyFrom(ctx context.Context, volumeID, srcPath string, dst *os.File) error {
	if volumeID == "" || l.quiescer == nil {
		return copyFile(ctx, srcPath, dst, true)
	}
	hold, err := l.quiescer.Quiesce(ctx, volumeID)
	if err != nil {
		return fmt.Errorf("hold volume %s still for the copy: %w", volumeID, err)
	}
	defer hold.Release()
	if err := copyFile(hold.Ctx, srcPath, dst, hold.Stable); err != nil {
		if hold.Ctx.Err() != nil && ctx.Err() == nil {
			// Retrying at once would freeze the volume's writers again
			// for as long: say why, and let the caller wait.
			return fmt.Errorf("copy volume %s: not done within the time its filesystem may stay frozen "+
				"(unstage it, or use a data dir with reflink): %w: %w", volumeID, ErrSourceInUse, err)
		}
		return fmt.Errorf("copy volume %s: %w", volumeID, err)
	}
	if hold.Stable && hold.Ctx.Err() != nil && ctx.Err() == nil {
		// The hold ended (the filesystem thawed at its limit) while the
		// copy's last reads ran: they may have seen writes.
		return fmt.Errorf("copy volume %s: the hold ended before the copy did: %w", volumeID, ErrSourceInUse)
	}
	return nil
}
