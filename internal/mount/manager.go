// Package mount stages volumes on a node (format if blank, mount once per
// node) and publishes them to pods (bind mounts), on k8s.io/mount-utils.
package mount

import (
	"context"
	"os"

	"github.com/go-logr/logr"
	mountutils "k8s.io/mount-utils"
	"k8s.io/utils/exec"

	"github.com/berth-io/berth/internal/volerr"
)

// Sentinel errors, each of one volerr kind; returned errors wrap them with
// detail. A malformed request is volerr.ErrInvalid itself.
var (
	// ErrInUse: unstage refused while bind mounts or open handles remain.
	ErrInUse    = volerr.New(volerr.ErrInUse, "in use")
	ErrNotFound = volerr.New(volerr.ErrNotFound, "not found")
	// ErrExists: the path already holds another device or mode.
	ErrExists = volerr.New(volerr.ErrExists, "already exists with other parameters")
	// ErrNotStaged: publish before stage.
	ErrNotStaged = volerr.New(volerr.ErrPrecondition, "not staged")
)

// StageRequest mounts Device at StagingPath (or, for Block, binds the device
// node inside it).
type StageRequest struct {
	VolumeID, Device, StagingPath, FSType string
	MountFlags                            []string
	Block, ReadOnly                       bool
	// Format says whether a Device that shows no filesystem may be formatted.
	Format FormatPolicy
}

// PublishRequest binds a staged volume onto a pod's TargetPath.
type PublishRequest struct {
	VolumeID, StagingPath, TargetPath, Device string
	Block, ReadOnly                           bool
	MountFlags                                []string
}

// Stats is a volume's usage; Block volumes report only TotalBytes.
type Stats struct {
	TotalBytes, UsedBytes, AvailableBytes int64
	TotalInodes, UsedInodes, FreeInodes   int64
	Block                                 bool
}

// Manager stages and publishes volumes. Per-volume serialisation is the
// caller's job.
type Manager struct {
	mounter mountutils.Interface
	// exec runs blkid, mkfs, fsck and resize, each with a timeout.
	exec *Tools
	// gate lets mount-utils run mkfs only on devices allowFormat checked.
	gate *formatGate
	log  logr.Logger
	// lazyUnmount detaches a busy mount: the mounter's UnmountLazy, or its
	// plain Unmount when it has none (mount-utils' FakeMounter).
	lazyUnmount func(target string) error
	// forceUnmount aborts what blocks an unmount (an NFS server's RPCs):
	// the mounter's UnmountForce, or its plain Unmount.
	forceUnmount func(target string) error
	// Seams for unit tests; the real ones read /proc and /dev.
	mountInfo func() ([]mountutils.MountInfo, error)
	openers   func(dev string) ([]int, error)
	// procRoot is where holders are described ("/proc"): with the host's
	// PID namespace (the agent pod's hostPID) it lists every node process.
	procRoot  string
	devNumber func(dev string) (major, minor int, found bool, err error)
	blank     func(ctx context.Context, dev, image string) error
	// stat reaches the server of an NFS mount (ProbeShare).
	stat func(path string) (os.FileInfo, error)
	// shares holds the one probe and the one unmount in flight per share
	// mount.
	shares *inflight
}

// LazyUnmounter is a mounter that can also detach a mount while it is busy
// (MNT_DETACH), which mount-utils' Interface cannot; force cleanup needs it.
type LazyUnmounter interface {
	// UnmountLazy detaches target now and frees it once unused; nothing
	// mounted there gives an error wrapping unix.EINVAL.
	UnmountLazy(target string) error
}

// ForceUnmounter is a mounter that can force an unmount (umount -f: on
// NFS it aborts the requests that wait for a gone server), which
// mount-utils' Interface cannot.
type ForceUnmounter interface {
	UnmountForce(target string) error
}

// NewManager returns a Manager that mounts through m and runs mkfs, blkid,
// fsck and resize tools through e (Tools with their timeouts, or a plain
// executor that gets DefaultTimeouts).
// Force cleanup detaches busy mounts lazily when m is a LazyUnmounter
// (NewMounter's is).
func NewManager(m mountutils.Interface, e exec.Interface, log logr.Logger) *Manager {
	tools := toolsOf(e)
	if k, ok := m.(kernelMounter); ok {
		k.tools = tools
		m = k
	}
	lazy, force := m.Unmount, m.Unmount
	if l, ok := m.(LazyUnmounter); ok {
		lazy = l.UnmountLazy
	}
	if f, ok := m.(ForceUnmounter); ok {
		force = f.UnmountForce
	}
	return &Manager{
		mounter:      m,
		exec:         tools,
		gate:         newFormatGate(tools),
		log:          log,
		lazyUnmount:  lazy,
		forceUnmount: force,
		mountInfo:    readMountInfo,
		openers:      procOpeners,
		procRoot:     "/proc",
		devNumber:    statDevNumber,
		blank:        checkBlank,
		stat:         os.Stat,
		shares:       &inflight{stalled: errShareStalled},
	}
}

// formatter formats and mounts through the format gate and tools bound to
// ctx: mount-utils' calls take no context, so one is made per call.
func (m *Manager) formatter(ctx context.Context) *mountutils.SafeFormatAndMount {
	mounter := m.mounter
	if k, ok := mounter.(kernelMounter); ok {
		k.tools = k.tools.Bind(ctx)
		mounter = k
	}
	return mountutils.NewSafeFormatAndMount(mounter, gateOver{gate: m.gate, tools: m.exec.Bind(ctx)})
}
