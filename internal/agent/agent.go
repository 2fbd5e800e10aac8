// Package agent is the node agent's core: the volume operations that both
// the CSI node service and the Flexvolume driver (through the agent socket)
// call. Each operation takes the volume's lock, fences through the
// Attachment, then attaches, mounts or undoes that.
package agent

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"time"

	"github.com/go-logr/logr"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/tools/record"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/berth-io/berth/api/v1alpha1"
	"github.com/berth-io/berth/internal/backend"
	"github.com/berth-io/berth/internal/backend/ceph"
	"github.com/berth-io/berth/internal/fence"
	"github.com/berth-io/berth/internal/krbd"
	"github.com/berth-io/berth/internal/mount"
	"github.com/berth-io/berth/internal/nodepath"
	"github.com/berth-io/berth/internal/volerr"
	"github.com/berth-io/berth/internal/volid"
)

// Images finds a volume's backend image on this node, and keeps on it the
// record that it holds a filesystem.
type Images interface {
	Get(ctx context.Context, id string) (backend.Image, error)
	FormatRecords
}

// FormatRecords keep on a volume's image the record that it holds a
// filesystem, which stage trusts over what blkid finds: an xattr on a local
// image file (backend.Local), metadata on an RBD image (ceph.Backend).
type FormatRecords interface {
	Format(ctx context.Context, id string) (rec backend.FormatRecord, found bool, err error)
	RecordFormat(ctx context.Context, id, fsType string, at time.Time) error
}

// OpenCephRecords connects to Ceph to read and write RBD images' format
// records (ceph.OpenRecords).
type OpenCephRecords func(ctx context.Context, cfg ceph.Config, log logr.Logger) (ceph.Records, error)

// Fencer records and checks who holds a volume (internal/fence).
type Fencer interface {
	Acquire(ctx context.Context, r fence.Request) error
	Release(ctx context.Context, volume, node, mountDir string) error
	// ReportStaged writes (or, with no device, clears) this node's entry in
	// the Attachment's status.
	ReportStaged(ctx context.Context, volume string, s fence.Staged) error
}

// Agent runs volume operations on one node.
type Agent struct {
	node string
	rbd  krbd.Bus
	api  client.Reader
	// cached reads this node's Volumes from a watch's cache (Config.Volumes).
	cached client.Reader
	images Images
	loop   mount.Loop
	mounts *mount.Manager
	fence  Fencer
	locks  *VolumeLocks
	log    logr.Logger
	flex   FlexConfig
	us     *UserspaceConfig
	procs  servers
	// status and clock record formats in Volume status (Config.Status).
	status client.StatusClient
	clock  clock.PassiveClock
	// lockWait bounds how long the stale-entry cleanup waits
	// for a busy volume before it gives up and retries later.
	lockWait time.Duration
	// paths says which paths from kubelet and API objects the agent may
	// mount, unmount or remove; the zero Rule refuses every one.
	paths nodepath.Rule
	// events tells on Volumes and PVs why an unstage waits (Config.Events).
	events record.EventRecorder
	// openRecords connects to Ceph for format records (Config.CephRecords).
	openRecords OpenCephRecords
	// nfs and shareWait serve RWX volumes' workloads (Config.NFS, ShareWait).
	nfs       NFSClient
	shareWait time.Duration
	// freezeDir holds the mounts that freeze shared volumes and the freeze
	// records (Config.FreezeDir); freezeLimit bounds a freeze (Config.FreezeLimit).
	freezeDir   string
	freezeLimit time.Duration
	// netns runs storage network work in holders' namespaces (Config.Netns).
	netns holderNS
	// reports are the volumes whose Attachment names their live server's
	// Ceph clients (cephclients.go).
	reports reported
}

// DefaultLockWait is how long background work waits for a busy volume.
const DefaultLockWait = 10 * time.Second

// Config is everything an agent works with. Node, API, Images, Loop, Mounts
// and Fence are required; the rest is optional and says what its zero value
// leaves out.
type Config struct {
	// Node is the node this agent serves: it stages only volumes of this
	// node and holds Attachment entries in its name.
	Node string
	// API reads Volume and StorageCluster objects, uncached, so that a
	// volume made a moment ago is found.
	API client.Reader
	// Volumes reads this node's Volume objects from a cache kept by a
	// watch (the manager's). The healer reads there first, so that an
	// agent restart heals its volumes without an API round trip each
	// (100 of them at once loaded the API server the heal waits on). A
	// Volume the cache lacks (made a moment ago, a node-less ceph volume)
	// is read through API, which alone says that a Volume is gone (nil:
	// every read goes to API).
	Volumes client.Reader
	// Images finds a volume's backend image and its format record.
	Images Images
	// Loop attaches image files as loop devices (the kernel mounter, and
	// the FUSE transport's file).
	Loop mount.Loop
	// Mounts formats, mounts and unmounts staging and publish paths.
	Mounts *mount.Manager
	// Fence records and checks who holds a volume (internal/fence).
	Fence Fencer
	// Locks are the per-volume locks; pass the healer's or cleaner's
	// locks to share them (nil: new ones, see Agent.Locks).
	Locks *VolumeLocks
	// Log is the agent's logger (zero: discard).
	Log logr.Logger
	// LockWait bounds how long the stale-entry cleanup waits
	// for a busy volume before it retries later, so that one stuck
	// volume never stops the others (0: DefaultLockWait).
	LockWait time.Duration
	// Paths says which kubelet and API paths the agent may mount, unmount
	// or remove; the zero Rule refuses every path (fail closed).
	Paths nodepath.Rule
	// Flex enables the Flexvolume operations (zero: refused).
	Flex FlexConfig
	// Status lets the agent record in a Volume's status that it holds a
	// filesystem (status.formatted), a second record beside the image's
	// (nil: only the image keeps it).
	Status client.StatusClient
	// Clock stamps those records (nil: the real clock).
	Clock clock.PassiveClock
	// Events tells on the Volume and its PV why an unstage waits, since
	// kubelet shows only its own words (nil: logged and returned only).
	Events record.EventRecorder
	// Userspace enables volumes with mounter userspace (nil: refused).
	Userspace *UserspaceConfig
	// CephRecords connects to Ceph with a stage's cephx client to read and
	// write a ceph volume's format record (nil: ceph.OpenRecords).
	CephRecords OpenCephRecords
	// NFS says whether this node can mount RWX volumes' shares (nil:
	// mount.HostNFSClient). ShareWait bounds a publish's wait for the
	// share to run (0: DefaultShareWait).
	NFS       NFSClient
	ShareWait time.Duration
	// FreezeDir is where an RWX volume's filesystem is mounted a moment to
	// freeze it for a copy while its share manager's pod holds the mount
	// (mount.Manager.FreezeElsewhere; "": os.TempDir()), and where the
	// records of freezes live until the thaw (ThawLeftovers): it must
	// outlive the agent's container, not the node's boot.
	FreezeDir string
	// FreezeLimit bounds how long a filesystem stays frozen for a copy,
	// even when the copy hangs (0: DefaultFreezeLimit).
	FreezeLimit time.Duration
	// Netns finds the holders' namespaces of clusters in the netns mode.
	Netns NetnsConfig
	// RBD is the kernel's rbd bus, which maps ceph volumes with mounter
	// kernel (zero: /sys/bus/rbd and /dev).
	RBD krbd.Bus
}

// ErrConfig means that New was given an unusable Config.
var ErrConfig = errors.New("agent config")

// New returns the agent that c describes, or an error naming every field
// that is missing or wrong.
func New(c Config) (*Agent, error) {
	var errs []error
	bad := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("%w: "+format, append([]any{ErrConfig}, args...)...))
	}
	if c.Node == "" {
		bad("Node is empty: the agent must know its node to fence")
	}
	for _, f := range []struct {
		name    string
		missing bool
	}{{"API", c.API == nil}, {"Images", c.Images == nil}, {"Loop", c.Loop == nil}, {"Mounts", c.Mounts == nil}, {"Fence", c.Fence == nil}} {
		if f.missing {
			bad("%s is nil (required)", f.name)
		}
	}
	if c.LockWait < 0 {
		bad("LockWait %v is negative", c.LockWait)
	}
	if c.FreezeLimit < 0 {
		bad("FreezeLimit %v is negative", c.FreezeLimit)
	}
	if c.Flex.StagingRoot != "" && !filepath.IsAbs(c.Flex.StagingRoot) {
		bad("Flex.StagingRoot %q is not an absolute path", c.Flex.StagingRoot)
	}
	if (c.Flex.StagingRoot == "") != (c.Flex.Holdings == nil) {
		bad("Flex needs both StagingRoot and Holdings, or neither")
	}
	var us *UserspaceConfig
	if c.Userspace != nil {
		u, err := c.Userspace.withDefaults()
		if err != nil {
			errs = append(errs, fmt.Errorf("%w: Userspace: %w", ErrConfig, err))
		}
		us = &u
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	a := &Agent{node: c.Node, api: c.API, cached: c.Volumes, images: c.Images, loop: c.Loop, mounts: c.Mounts, fence: c.Fence,
		locks: c.Locks, log: c.Log, lockWait: c.LockWait, paths: c.Paths, flex: c.Flex,
		status: c.Status, clock: c.Clock, events: c.Events, us: us, openRecords: c.CephRecords,
		nfs: c.NFS, shareWait: c.ShareWait, freezeDir: c.FreezeDir, freezeLimit: c.FreezeLimit, netns: newHolderNS(c.Netns), rbd: c.RBD}
	if a.nfs == nil {
		a.nfs = mount.HostNFSClient()
	}
	if a.shareWait == 0 {
		a.shareWait = DefaultShareWait
	}
	if a.locks == nil {
		a.locks = NewVolumeLocks()
	}
	if a.lockWait == 0 {
		a.lockWait = DefaultLockWait
	}
	if a.freezeLimit == 0 {
		a.freezeLimit = DefaultFreezeLimit
	}
	return a, nil
}

// Paths is the rule for paths arriving at the agent (CSI, Flexvolume, API objects).
func (a *Agent) Paths() nodepath.Rule { return a.paths }

// checkPaths refuses any path outside the node's volume folders.
func (a *Agent) checkPaths(paths ...string) error {
	for _, p := range paths {
		if err := a.paths.Check(p); err != nil {
			return fmt.Errorf("%w: %w", err, volerr.ErrInvalid)
		}
	}
	return nil
}

// checkRecordedPaths is checkPaths for paths an API object recorded:
// only the exact shapes kubelet and berth make (nodepath.CheckRecorded).
func (a *Agent) checkRecordedPaths(paths ...string) error {
	for _, p := range paths {
		if err := a.paths.CheckRecorded(p); err != nil {
			return fmt.Errorf("%w: %w", err, volerr.ErrInvalid)
		}
	}
	return nil
}

// checkVolumeName applies the one volume ID rule.
func checkVolumeName(name string) error {
	return volid.Valid(name)
}

// Node is the node this agent serves.
func (a *Agent) Node() string { return a.node }

// Locks are the per-volume locks, shared with the healer.
func (a *Agent) Locks() *VolumeLocks { return a.locks }

func (a *Agent) lock(volume string) (func(), error) {
	if !a.locks.TryLock(volume) {
		return nil, fmt.Errorf("volume %s: %w", volume, ErrBusy)
	}
	return func() { a.locks.Unlock(volume) }, nil
}

// lockBackground waits a bounded time for the lock of volume (ErrBusy when
// it stays held): an operation stuck on the volume must never stop the
// background work on every other one.
func (a *Agent) lockBackground(ctx context.Context, volume string) (func(), error) {
	ctx, cancel := context.WithTimeout(ctx, a.lockWait)
	defer cancel()
	return a.locks.LockContext(ctx, volume)
}

// volume reads the Volume object and checks that it lives here.
func (a *Agent) volume(ctx context.Context, id string) (*v1.Volume, error) {
	vol, err := a.readVolume(ctx, id)
	if err != nil {
		return nil, err
	}
	return vol, a.checkNode(ctx, vol)
}

// cachedVolumeWait bounds a read from the cache of Volumes: one not
// synced yet must not hold a heal up longer than the API server would.
const cachedVolumeWait = 2 * time.Second

// cachedVolume is volume, read from the cache of this node's Volumes when
// it holds the Volume: the healer's read. A Volume it lacks is read from
// the API server, which alone says that a Volume is gone.
func (a *Agent) cachedVolume(ctx context.Context, id string) (*v1.Volume, error) {
	if a.cached != nil {
		cctx, cancel := context.WithTimeout(ctx, cachedVolumeWait)
		vol := &v1.Volume{}
		err := a.cached.Get(cctx, client.ObjectKey{Name: id}, vol)
		cancel()
		if err == nil {
			return vol, a.checkNode(ctx, vol)
		}
	}
	return a.volume(ctx, id)
}

// readVolume reads the Volume object, wherever it lives.
func (a *Agent) readVolume(ctx context.Context, id string) (*v1.Volume, error) {
	vol := &v1.Volume{}
	if err := a.api.Get(ctx, client.ObjectKey{Name: id}, vol); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, fmt.Errorf("volume %s: %w", id, ErrVolumeNotFound)
		}
		return nil, fmt.Errorf("read Volume %s: %w", id, err)
	}
	return vol, nil
}

// checkNode refuses a volume whose image lives on another node.
func (a *Agent) checkNode(ctx context.Context, vol *v1.Volume) error {
	if vol.Spec.Node != "" && vol.Spec.Node != a.node {
		return fmt.Errorf("volume %s is on node %s (its image lives there), this is %s%s: %w",
			vol.Name, vol.Spec.Node, a.node, a.heldBy(ctx, vol.Name), ErrWrongNode)
	}
	return nil
}

// heldBy names who holds the volume (", in use by ..."), so that a refusal
// tells the user which pod to stop; "" when nobody does or the Attachment
// cannot be read (the refusal stands without it).
func (a *Agent) heldBy(ctx context.Context, id string) string {
	att := &v1.Attachment{}
	if err := a.api.Get(ctx, client.ObjectKey{Name: id}, att); err != nil {
		return ""
	}
	// Pods say more than stage records; a stage record alone names the node.
	var pods, stages []string
	for _, e := range att.Spec.Attachments {
		if e.IsStage() {
			stages = append(stages, fence.Describe(e))
		} else {
			pods = append(pods, fence.Describe(e))
		}
	}
	if len(pods) == 0 {
		pods = stages
	}
	if len(pods) > 0 {
		return ", in use by " + strings.Join(pods, ", ")
	}
	return ""
}

// clusterLive refuses a volume whose StorageCluster is being deleted: its
// agents are detaching everything of it. It returns the cluster; nil when
// it does not exist (yet), which does not stop a stage.
func (a *Agent) clusterLive(ctx context.Context, vol *v1.Volume) (*v1.StorageCluster, error) {
	if vol.Spec.StorageCluster == "" {
		return nil, nil
	}
	sc := &v1.StorageCluster{}
	if err := a.api.Get(ctx, client.ObjectKey{Name: vol.Spec.StorageCluster}, sc); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, nil
		}
		return nil, fmt.Errorf("read StorageCluster %s: %w", vol.Spec.StorageCluster, err)
	}
	if !sc.DeletionTimestamp.IsZero() {
		return nil, fmt.Errorf("volume %s: storage cluster %s: %w", vol.Name, sc.Name, ErrClusterDeleting)
	}
	return sc, nil
}

func (a *Agent) imagePath(ctx context.Context, id string) (string, error) {
	img, err := a.volumeImages().Get(ctx, id)
	if err != nil {
		if errors.Is(err, backend.ErrNotFound) {
			return "", fmt.Errorf("image of volume %s: %w", id, ErrVolumeNotFound)
		}
		return "", fmt.Errorf("image of volume %s: %w", id, err)
	}
	return img.Path, nil
}

// Expand grows the volume's device to the image's new size and then the
// filesystem mounted at path (none for block volumes). It returns the size.
func (a *Agent) Expand(ctx context.Context, volumeID, path string, block bool) (int64, error) {
	unlock, err := a.lock(volumeID)
	if err != nil {
		return 0, err
	}
	defer unlock()
	img, err := a.volumeImages().Get(ctx, volumeID)
	if err != nil {
		if errors.Is(err, backend.ErrNotFound) {
			return 0, fmt.Errorf("volume %s: %w", volumeID, ErrVolumeNotFound)
		}
		return 0, err
	}
	shared, err := a.sharedVolume(ctx, volumeID, block)
	if err != nil {
		return 0, err
	}
	if shared {
		// A workload's NFS mount: the share manager grows the filesystem
		// on its own node (internal/cli/sharemanager), so nothing here
		// touches a device.
		a.log.Info("expand of a shared volume: its share manager grows it", "volume", volumeID, "path", path, "size", img.Size)
		return img.Size, nil
	}
	d, err := a.device(volumeID)
	if err != nil {
		return 0, err
	}
	dev, err := d.Expand(ctx, volumeID)
	if err != nil {
		return 0, err
	}
	if !block {
		if err := a.mounts.Expand(ctx, dev, path); err != nil {
			if errors.Is(err, mount.ErrGrowsAtStage) {
				// Not retryable online: kubelet takes FailedPrecondition as
				// "in use" and grows it at the next stage instead.
				return 0, fmt.Errorf("grow filesystem at %s: online growth is %w here: %w", path, ErrUnsupported, err)
			}
			return 0, fmt.Errorf("grow filesystem at %s: %w", path, err)
		}
	}
	return img.Size, nil
}

// GrowShareDevice grows this node's device of an RWX volume, which its
// share manager holds as a block device, to the image's size, and returns
// that size. A device at that size already is left alone: an agent that
// starts looks at every such volume, and some devices cannot grow online.
func (a *Agent) GrowShareDevice(ctx context.Context, volumeID string) (int64, error) {
	if img, err := a.volumeImages().Get(ctx, volumeID); err == nil {
		if dev, err := a.attachedDevice(ctx, volumeID); err == nil && dev != "" {
			if size, err := mount.DeviceSize(dev); err == nil && size >= img.Size {
				return img.Size, nil
			}
		}
	}
	return a.Expand(ctx, volumeID, "", true)
}

// sharedVolume tells whether a request for volumeID reaches it through its
// share (sharedFS). An image without a Volume is no shared one.
func (a *Agent) sharedVolume(ctx context.Context, volumeID string, block bool) (bool, error) {
	vol, err := a.readVolume(ctx, volumeID)
	if errors.Is(err, ErrVolumeNotFound) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	return sharedFS(vol, block), nil
}

// Stats reports usage of a published or staged path: a workload's mount of
// a share too, on a node other than the one that holds the volume's image.
func (a *Agent) Stats(ctx context.Context, volumeID, path string) (mount.Stats, error) {
	if _, err := a.volumeImages().Get(ctx, volumeID); err != nil {
		if !errors.Is(err, backend.ErrNotFound) {
			return mount.Stats{}, err
		}
		st, err := a.mounts.ShareStats(ctx, path, volumeID)
		if errors.Is(err, mount.ErrNotShareMount) {
			return mount.Stats{}, fmt.Errorf("volume %s: %w", volumeID, ErrVolumeNotFound)
		}
		return st, err
	}
	return a.mounts.Stats(ctx, path)
}

// Condition tells whether the volume at path is healthy, and its device
// (for a userspace volume: its keeper, connection and server).
func (a *Agent) Condition(ctx context.Context, volumeID, path string) (abnormal bool, msg string) {
	// A workload's mount of an RWX volume's share: no device on this node.
	if abnormal, msg, share := a.mounts.NFSCondition(ctx, path); share {
		return abnormal, msg
	}
	d, err := a.device(volumeID)
	if err != nil {
		return true, err.Error()
	}
	if abnormal, msg := d.Condition(ctx, volumeID); abnormal {
		return abnormal, msg
	}
	return a.mounts.Condition(ctx, path)
}
