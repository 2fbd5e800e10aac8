package mount

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// loopKernel is what finding a loop device reads from the kernel. Bound
// reads sysfs only; Status and Identify stat a backing file, which blocks
// while the file is on a FUSE connection whose server is gone.
type loopKernel interface {
	// Bound lists the loop devices that have a backing file.
	Bound() ([]boundLoop, error)
	// Status returns the identity of dev's backing file
	// (LOOP_GET_STATUS64).
	Status(dev string) (fileID, error)
	// Identify returns file's path as the kernel names it (symbolic links
	// resolved) and its identity.
	Identify(file string) (name string, id fileID, err error)
}

// boundLoop is a loop device and its backing file as sysfs names it: by
// its path in the mount namespace that attached the device, or, once that
// namespace is gone, by its path below the mount that held it.
type boundLoop struct {
	Dev      string
	Backing  string
	ReadOnly bool
}

// fileID is a file's identity: its file system's device and its inode.
type fileID struct {
	Major, Minor uint32
	Ino          uint64
}

// sysLoop is the host's loop devices: sysfs below sysfs, nodes in /dev.
type sysLoop struct{ sysfs string }

func (s sysLoop) Bound() ([]boundLoop, error) {
	block := filepath.Join(s.sysfs, "block")
	entries, err := os.ReadDir(block)
	if err != nil {
		return nil, fmt.Errorf("list loop devices: %w", err)
	}
	var bound []boundLoop
	for _, e := range entries {
		dev := "/dev/" + e.Name()
		if !isDevPath(dev) {
			continue
		}
		b, err := os.ReadFile(filepath.Join(block, e.Name(), "loop", "backing_file"))
		// No loop folder: a free device. ENXIO: freed while we read.
		if errors.Is(err, fs.ErrNotExist) || errors.Is(err, unix.ENXIO) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("backing file of %s: %w", dev, err)
		}
		ro, err := os.ReadFile(filepath.Join(block, e.Name(), "ro"))
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("read-only flag of %s: %w", dev, err)
		}
		bound = append(bound, boundLoop{Dev: dev, Backing: strings.TrimSuffix(string(b), "\n"),
			ReadOnly: strings.TrimSpace(string(ro)) == "1"})
	}
	return bound, nil
}

func (sysLoop) Status(dev string) (fileID, error) {
	fd, err := unix.Open(dev, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fileID{}, fmt.Errorf("open %s: %w", dev, err)
	}
	defer func() { _ = unix.Close(fd) }()
	info, err := unix.IoctlLoopGetStatus64(fd)
	if err != nil {
		return fileID{}, fmt.Errorf("status of %s: %w", dev, err)
	}
	// The kernel's new_encode_dev; glibc's st_dev layout differs for
	// large device numbers.
	d := info.Device
	return fileID{Major: uint32((d & 0xfff00) >> 8), Minor: uint32((d & 0xff) | ((d >> 12) & 0xfff00)), Ino: info.Inode}, nil
}

func (sysLoop) Identify(file string) (string, fileID, error) {
	// O_PATH: only the path walk, no open on the file system.
	fd, err := unix.Open(file, unix.O_PATH|unix.O_CLOEXEC, 0)
	if err != nil {
		return "", fileID{}, &fs.PathError{Op: "open", Path: file, Err: err}
	}
	defer func() { _ = unix.Close(fd) }()
	// The kernel's name for the file, as sysfs prints backing files.
	name, err := os.Readlink("/proc/self/fd/" + strconv.Itoa(fd))
	if err != nil {
		return "", fileID{}, err
	}
	var st unix.Statx_t
	// DONT_SYNC: device and inode never change, no need to ask FUSE.
	if err := unix.Statx(fd, "", unix.AT_EMPTY_PATH|unix.AT_STATX_DONT_SYNC, unix.STATX_INO, &st); err != nil {
		return "", fileID{}, &fs.PathError{Op: "statx", Path: file, Err: err}
	}
	return name, fileID{Major: st.Dev_major, Minor: st.Dev_minor, Ino: st.Ino}, nil
}

// mayBeOver says whether a loop device whose backing file sysfs names
// shown may be over file (named as this process names it): the same path,
// or a tail of it when the namespace that attached the device is gone (an
// agent container restarted).
func mayBeOver(file, shown string) bool {
	return shown == file || (strings.HasPrefix(shown, "/") && len(shown) > 1 && strings.HasSuffix(file, shown))
}

// errStalled means a stat of a backing file did not answer in time.
var errStalled = fmt.Errorf("backing file did not answer (a FUSE file whose server is gone?): %w", ErrToolTimeout)

// finder finds the loop device over a file by the file's identity, so that
// a file of the same path in another mount namespace (another node's, on a
// shared kernel) never matches. Only the devices whose backing path may be
// the file's are asked for their identity: a device over a stalled FUSE
// file delays only lookups of that path.
type finder struct {
	kernel  loopKernel
	timeout time.Duration
	calls   *inflight
}

type loopMatch struct {
	dev      string
	readOnly bool
}

func (f finder) find(ctx context.Context, file string) (loopMatch, bool, error) {
	ctx, cancel := context.WithTimeout(ctx, f.timeout)
	defer cancel()
	abs, err := filepath.Abs(file)
	if err != nil {
		return loopMatch{}, false, err
	}
	name, id, idErr := f.identify(ctx, abs)
	if errors.Is(idErr, fs.ErrNotExist) || errors.Is(idErr, unix.ENOTDIR) {
		// No such file here; a device over one of that path elsewhere is
		// not ours.
		return loopMatch{}, false, nil
	}
	if errors.Is(idErr, ErrToolTimeout) {
		return loopMatch{}, false, idErr
	}
	bound, err := f.kernel.Bound()
	if err != nil {
		return loopMatch{}, false, err
	}
	var cands []boundLoop
	for _, b := range bound {
		if idErr == nil && mayBeOver(name, b.Backing) || idErr != nil && b.Backing == abs {
			cands = append(cands, b)
		}
	}
	type answer struct {
		b   boundLoop
		id  fileID
		err error
	}
	answers := make(chan answer, len(cands))
	for _, b := range cands {
		go func() {
			v, err := f.calls.do(ctx, "status of "+b.Dev, func() (any, error) { return f.kernel.Status(b.Dev) })
			id, _ := v.(fileID)
			answers <- answer{b, id, err}
		}()
	}
	var stalled []string
	var dead []boundLoop
	for range cands {
		a := <-answers
		switch {
		case errors.Is(a.err, ErrToolTimeout):
			stalled = append(stalled, a.b.Dev)
		case errors.Is(a.err, unix.ENXIO):
			// Freed since listed.
		case a.err != nil:
			dead = append(dead, a.b)
		case idErr == nil && a.id == id:
			return loopMatch{a.b.Dev, a.b.ReadOnly}, true, nil
		}
	}
	if len(stalled) > 0 {
		return loopMatch{}, false, fmt.Errorf("loop devices %v may be over %s: %w", stalled, abs, errStalled)
	}
	if idErr == nil {
		return loopMatch{}, false, nil
	}
	// Our file cannot be read (a FUSE connection that ended): a device of
	// its path whose file cannot be read either is on that connection;
	// one whose file can be is on another.
	switch len(dead) {
	case 0:
		return loopMatch{}, false, nil
	case 1:
		return loopMatch{dead[0].Dev, dead[0].ReadOnly}, true, nil
	}
	return loopMatch{}, false, fmt.Errorf("%d loop devices are over %s or a file of that path elsewhere, and none can be read to tell which (%v): %w",
		len(dead), abs, dead, idErr)
}

// identify is the kernel's name and the identity of file.
func (f finder) identify(ctx context.Context, file string) (string, fileID, error) {
	type named struct {
		name string
		id   fileID
	}
	v, err := f.calls.do(ctx, "identity of "+file, func() (any, error) {
		name, id, err := f.kernel.Identify(file)
		return named{name, id}, err
	})
	n, _ := v.(named)
	return n.name, n.id, err
}
