package agent

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/berth-io/berth/api/v1alpha1"
	"github.com/berth-io/berth/internal/mount"
	"github.com/berth-io/berth/internal/share/nfsclient"
	"github.com/berth-io/berth/internal/volerr"
	"github.com/berth-io/berth/internal/volid"
)

// Read-write-many filesystem volumes reach workload pods over NFS from the
// volume's share manager, which alone holds the device. The share manager's
// own pod claims the same volume as a raw block device through a static PV
// whose handle is volid.ShareDevice of the volume (another volume to
// kubelet, which keys its state by handle): that request is an ordinary
// stage and publish, told apart from a workload's by asking for block mode.
// PVs made before that handle carry the volume ID itself, and still work.

// NFSClient tells whether this node can mount NFS with the kernel client
// (mount.HostNFSClient is the real one).
type NFSClient interface{ Check() error }

// DefaultShareWait bounds how long a workload's publish waits for the share
// to run before it answers Unavailable (kubelet retries).
const DefaultShareWait = 60 * time.Second

// shareInterval is how often a publish looks at the Volume's share state.
const shareInterval = time.Second

// shareClientsLock is the lock key of a shared volume's workload side on
// this node (its NFS mounts), apart from the volume's own lock, which its
// device takes (the share manager's stage and publish, the healer, a
// freeze). A workload's publish waits up to shareWait for the share to run:
// under the volume's lock it kept the share manager's stage on the same
// node out ("another operation on this volume is in progress") until it
// gave up, again at each retry, and the share never started. Volume IDs
// hold no "/", so no volume's own key is one of these.
func shareClientsLock(id string) string { return id + "/nfs-clients" }

// publishLock is the lock a workload's publish or unpublish of volume id
// (its plain handle) takes: shareClientsLock for a volume served over NFS,
// else the volume's own. A Volume that cannot be read takes the volume's
// own lock; the operation then reports why.
func (a *Agent) publishLock(ctx context.Context, id string) string {
	vol, err := a.readVolume(ctx, id)
	if err != nil || !vol.Spec.ServedOverNFS() {
		return id
	}
	return shareClientsLock(id)
}

// sharedFS tells whether a request for vol goes through the share: an RWX
// filesystem volume asked for as a filesystem (a workload). The share
// manager asks for a block device.
func sharedFS(vol *v1.Volume, block bool) bool { return vol.Spec.ServedOverNFS() && !block }

// shareDevice tells whether a block request for vol is the share manager's
// (an RWX filesystem volume, which only it reaches as a device).
func shareDevice(vol *v1.Volume, block bool) bool { return vol.Spec.ServedOverNFS() && block }

// checkMode refuses a request whose block mode does not fit the volume,
// letting the share manager's block request of an RWX filesystem volume pass.
func checkMode(vol *v1.Volume, id string, block bool) error {
	if block == (vol.Spec.VolumeMode == v1.VolumeModeBlock) || shareDevice(vol, block) {
		return nil
	}
	return fmt.Errorf("volume %s is %s, the request asks otherwise: %w", id, vol.Spec.VolumeMode, volerr.ErrInvalid)
}

// checkShareDevice refuses a request made through the share manager's
// handle (viaShare) that is not the block request of a shared volume: the
// handle names nothing else.
func checkShareDevice(vol *v1.Volume, id string, viaShare, block bool) error {
	if !viaShare || shareDevice(vol, block) {
		return nil
	}
	return fmt.Errorf("volume %s is %s %s: handle %s names only the share manager's block device of a ReadWriteMany filesystem volume: %w",
		id, vol.Spec.AccessMode, vol.Spec.VolumeMode, volid.ShareDevice(id), volerr.ErrInvalid)
}

// publishShared mounts the volume's share at the pod's target path. The
// node's NFS client is checked before anything is made. Then the pod's
// Attachment entry is written first, since it is what makes the share
// needed (internal/controller/sharemanager); a publish that gives up
// waiting keeps it (kubelet retries, or unpublishes the uncertain mount).
func (a *Agent) publishShared(ctx context.Context, r PublishRequest, vol *v1.Volume) error {
	if err := a.nfs.Check(); err != nil {
		return fmt.Errorf("volume %s is ReadWriteMany, served over NFS: %w", r.VolumeID, err)
	}
	holders, err := a.shareHolders(ctx, r.VolumeID, vol)
	if err != nil {
		return err
	}
	release, err := a.holdForPod(ctx, r, vol)
	if err != nil {
		return err
	}
	source, opts, err := a.waitShare(ctx, r.VolumeID)
	if err != nil {
		if !errors.Is(err, volerr.ErrUnavailable) && ctx.Err() == nil {
			release()
		}
		return err
	}
	// The kernel's NFS client connects from the namespace of the process
	// that mounts: in the netns mode, the holder's.
	err = a.netns.do(r.VolumeID, holders, func() error {
		return a.mounts.MountNFS(ctx, mount.NFSRequest{
			VolumeID: r.VolumeID, Source: source, TargetPath: r.TargetPath, ReadOnly: r.ReadOnly,
			MountFlags: append(opts, r.MountFlags...),
		})
	})
	if err != nil {
		release()
		return fmt.Errorf("publish %s at %s: %w", r.VolumeID, r.TargetPath, err)
	}
	a.log.Info("published share", "volume", r.VolumeID, "source", source, "target", r.TargetPath, "pod", r.Pod.Namespace+"/"+r.Pod.Name)
	return nil
}

// waitShare waits, at most shareWait, for the Volume's share to run and
// admit this node, and returns its NFS source (host:/export) and mount
// options (the port).
func (a *Agent) waitShare(ctx context.Context, id string) (source string, opts []string, err error) {
	var last *v1.Volume
	err = wait.PollUntilContextTimeout(ctx, shareInterval, a.shareWait, true, func(ctx context.Context) (bool, error) {
		vol, err := a.readVolume(ctx, id)
		if err != nil {
			return false, err
		}
		last = vol
		// Admitted too: ganesha refuses a node not yet on its client
		// list, and a refused mount would drop this pod's entry, which
		// is what gets the node listed.
		return vol.Status.ShareState == v1.ShareRunning && vol.Status.ShareEndpoint != "" && slices.Contains(vol.Status.ShareNodes, a.node), nil
	})
	if err != nil {
		if last == nil || ctx.Err() != nil {
			return "", nil, err
		}
		state := string(last.Status.ShareState)
		switch {
		case state == "":
			state = "not started"
		case last.Status.ShareState == v1.ShareRunning:
			state += " but does not admit node " + a.node + " yet"
		}
		return "", nil, fmt.Errorf("%w: the NFS share of volume %s is %s after %s (see `kubectl get sharemanagers -A`); retry",
			volerr.ErrUnavailable, id, state, a.shareWait)
	}
	return nfsSource(last.Status.ShareEndpoint)
}

// nfsSource turns a share endpoint, nfs://host[:port]/export, into the
// kernel client's source and options. It reads the endpoint as the share
// manager and `berth share probe` do (nfsclient.ParseEndpoint), so that no
// endpoint mounts here what they refuse (a "..", user info, a query).
func nfsSource(endpoint string) (string, []string, error) {
	ep, err := nfsclient.ParseEndpoint(endpoint)
	if err != nil {
		return "", nil, fmt.Errorf("share endpoint %q is not nfs://host[:port]/export: %w: %w", endpoint, err, volerr.ErrInvalid)
	}
	host, port, err := net.SplitHostPort(ep.Addr)
	if err != nil {
		return "", nil, fmt.Errorf("share endpoint %q: %w: %w", endpoint, err, volerr.ErrInvalid)
	}
	if strings.Contains(host, ":") {
		host = "[" + host + "]"
	}
	var opts []string
	if port != "2049" {
		opts = append(opts, "port="+port)
	}
	return host + ":" + ep.Export, opts, nil
}

// workloadStage tells whether an unstage at stagingPath is a workload's of
// a shared volume, which staged nothing: the volume is RWX filesystem and
// this node holds no stage record there. The share manager's stage on the
// same node has its own staging path and record, and is never undone here.
func (a *Agent) workloadStage(ctx context.Context, id, stagingPath string) (bool, error) {
	vol := &v1.Volume{}
	if err := a.api.Get(ctx, client.ObjectKey{Name: id}, vol); err != nil {
		return false, client.IgnoreNotFound(err)
	}
	if !sharedFS(vol, false) {
		return false, nil
	}
	// No Attachment: no stage record either.
	att := &v1.Attachment{}
	if err := a.api.Get(ctx, client.ObjectKey{Name: id}, att); client.IgnoreNotFound(err) != nil {
		return false, fmt.Errorf("read Attachment %s: %w", id, err)
	}
	for _, e := range att.Spec.Attachments {
		if e.IsStage() && e.Node == a.node && e.MountDir == stagingPath {
			return false, nil
		}
	}
	return true, nil
}

// shareHolders is the holder folder of the namespace vol's share is
// mounted from ("" : this one); a cluster in the netns mode without a live
// holder here is refused before anything is made.
func (a *Agent) shareHolders(ctx context.Context, id string, vol *v1.Volume) (string, error) {
	sc, err := a.clusterLive(ctx, vol)
	if err != nil {
		return "", err
	}
	holders := a.netns.folder(sc)
	if holders == "" {
		return "", nil
	}
	f, err := a.netns.open(id, holders, nothingMade)
	if err != nil {
		return "", err
	}
	return holders, f.Close()
}
