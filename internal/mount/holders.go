package mount

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/berth-io/berth/internal/podcgroup"
)

// Holder is a process that holds a block device open.
type Holder struct {
	PID     int
	Command string // /proc/<pid>/comm; "" when the process is gone
	// PodUID is the pod the process runs in, from its cgroup path; "" for
	// a process outside any pod (or one that is gone).
	PodUID string
}

func (h Holder) String() string {
	s := "pid " + strconv.Itoa(h.PID)
	if h.Command != "" {
		s += " (" + h.Command + ")"
	}
	if h.PodUID != "" {
		s += " in pod " + h.PodUID
	}
	return s
}

// HeldOpenError refuses an unstage because processes hold the device open:
// unmounting under them would leave them on a detached file system. It is
// ErrInUse (and so volerr.ErrInUse) for errors.Is, so callers that only know
// "in use" keep working.
type HeldOpenError struct {
	Device  string
	Holders []Holder
}

func (e *HeldOpenError) Error() string {
	hs := make([]string, len(e.Holders))
	for i, h := range e.Holders {
		hs[i] = h.String()
	}
	return fmt.Sprintf("device %s is held open by %s", e.Device, strings.Join(hs, ", "))
}

// Unwrap makes a HeldOpenError match ErrInUse.
func (e *HeldOpenError) Unwrap() error { return ErrInUse }

// describeHolder reads the command and pod of pid below procRoot; a process
// that went away meanwhile is named by its pid alone.
func describeHolder(procRoot string, pid int) Holder {
	h := Holder{PID: pid}
	dir := filepath.Join(procRoot, strconv.Itoa(pid))
	if b, err := os.ReadFile(filepath.Join(dir, "comm")); err == nil {
		h.Command = strings.TrimSpace(string(b))
	}
	if b, err := os.ReadFile(filepath.Join(dir, "cgroup")); err == nil {
		h.PodUID = podcgroup.PodUID(string(b))
	}
	return h
}
