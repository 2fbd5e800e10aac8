package agent

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	v1 "github.com/berth-io/berth/api/v1alpha1"
	"github.com/berth-io/berth/internal/atomicfile"
	"github.com/berth-io/berth/internal/backend/ceph"
	"github.com/berth-io/berth/internal/blockdev/rbdimage"
	"github.com/berth-io/berth/internal/volerr"
)

// TransportRBD: a blockdev server serves a ceph volume's RBD image through
// librbd, over FUSE + loop, nbd or ublk as the userspace transport says
// (the record's Via); the keeper and the healer work as for local images.
const TransportRBD Transport = "rbd"

// Where kubelet's NodeStageVolume secrets (the StorageClass's
// csi.storage.k8s.io/node-stage-secret-*) carry the cephx client: the keys
// of the StorageCluster's Secret.
const (
	secretUserID  = v1.CephSecretUserID
	secretUserKey = v1.CephSecretUserKey
)

// cephAccessDir holds the volumes' access files (monitors, client, key,
// image) beside their records, 0600 in the run dir: a server the healer
// starts after an agent restart reads its key there, as kubelet does not
// stage again. '_' is in no volume name.
const cephAccessDir = "_ceph"

// rbdDevice serves ceph volumes in userspace: fuse, nbd or ublk (by the
// record's Via) does the kernel side, with an image spec that names the
// volume's access file instead of an image file.
type rbdDevice struct {
	userspace
	fuse, nbd, ublk device
	// via is the userspace transport a new stage in sc uses.
	via func(sc *v1.StorageCluster) Transport
	// lookup resolves monitor host names (nil: the system resolver).
	lookup func(ctx context.Context, host string) ([]string, error)
}

// refuseCephFlex refuses a Flexvolume mount of a ceph volume before
// anything is made: kubelet hands stage secrets, the cephx key, to CSI
// drivers only.
func (a *Agent) refuseCephFlex(ctx context.Context, volume string) error {
	vol, err := a.volume(ctx, volume)
	if err != nil {
		return err
	}
	sc, err := a.clusterLive(ctx, vol)
	if err != nil || sc == nil || sc.Spec.Backend != v1.BackendCeph {
		return err
	}
	return fmt.Errorf("volume %s is in ceph StorageCluster %s, whose cephx key kubelet hands to CSI drivers only, never to a "+
		"Flexvolume driver: mount it through berth's CSI driver (a PVC of the cluster's StorageClass): %w", volume, sc.Name, ErrUnsupported)
}

// cephTransport is how a ceph volume reaches the kernel: through librbd in
// a blockdev server (mounter userspace), else through krbd.
func cephTransport(vol *v1.Volume) Transport {
	if vol.Spec.Mounter == v1.MounterUserspace {
		return TransportRBD
	}
	return TransportKRBD
}

func (r rbdDevice) accessPath(volume string) string {
	return filepath.Join(r.cfg.Root, cephAccessDir, volume+".json")
}

// inner is the transport that serves a staged volume.
func (r rbdDevice) inner(volume string) (device, error) {
	rec, _, err := r.records.load(volume)
	if err != nil {
		return nil, err
	}
	switch rec.Via {
	case TransportNBD:
		return r.nbd, nil
	case TransportUblk:
		return r.ublk, nil
	}
	return r.fuse, nil
}

// Check refuses, before anything is made, on a binary without librbd.
func (r rbdDevice) Check(volume string) error {
	if !rbdimage.Built {
		return fmt.Errorf("volume %s is a ceph volume with mounter userspace, served through librbd, but %w; "+
			"run an agent image built with the ceph tag: %w", volume, rbdimage.ErrNotBuilt, ErrUnsupported)
	}
	return nil
}

func (r rbdDevice) Attach(ctx context.Context, req attachRequest) (attachment, error) {
	access, err := r.access(ctx, req)
	if err != nil {
		return attachment{}, err
	}
	rec, _, err := r.records.load(req.Volume)
	if err != nil {
		return attachment{}, err
	}
	if rec.Via == "" {
		// A new stage: the transport is chosen once, like the record's,
		// and so is the network: a cluster in the netns mode needs its
		// holder's namespace before anything is made.
		holders, via := r.netns.folder(req.Cluster), r.via(req.Cluster)
		if holders != "" {
			if via == TransportNBD {
				// The server sets its nbd device up over generic netlink,
				// which kernels without a namespace-aware nbd family
				// answer only in the host's namespace.
				return attachment{}, fmt.Errorf("volume %s: StorageCluster %s runs its storage network in the netns mode, where "+
					"its blockdev servers run in the holder's network namespace, and the nbd transport is not available from there; "+
					"set the cluster's spec.agent.userspaceTransport to %s: %w", req.Volume, req.Cluster.Name, TransportFUSE, ErrUnsupported)
			}
			ns, err := r.netns.open(req.Volume, holders, nothingMade)
			if err != nil {
				return attachment{}, err
			}
			_ = ns.Close()
		}
		rec = volumeRecord{Transport: TransportRBD, Via: via, Holders: holders}
		if err := r.records.save(req.Volume, rec); err != nil {
			return attachment{}, err
		}
	}
	in, err := r.inner(req.Volume)
	if err != nil {
		return attachment{}, err
	}
	if err := in.Check(req.Volume); err != nil {
		return attachment{}, err
	}
	path := r.accessPath(req.Volume)
	_, statErr := os.Stat(path)
	madeAccess := errors.Is(statErr, os.ErrNotExist)
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return attachment{}, fmt.Errorf("volume %s: %w", req.Volume, err)
	}
	// Written again on a repeated stage: a key rotated in the Secret
	// reaches the next server.
	if err := rbdimage.Write(path, access); err != nil {
		return attachment{}, fmt.Errorf("volume %s: %w", req.Volume, err)
	}
	att, err := in.Attach(ctx, attachRequest{Volume: req.Volume, Image: rbdimage.Spec(path), ReadOnly: req.ReadOnly})
	if err != nil {
		err = serverCause(err)
	}
	if err != nil && madeAccess && !att.NewConnection {
		// Nothing else of this call stays to be undone (Stop would).
		if rerr := r.removeAccess(req.Volume); rerr != nil {
			r.log.Error(rerr, "remove access file after failed stage", "volume", req.Volume)
		}
	}
	return att, err
}

// removeAccess removes the volume's access file and the client addresses
// its servers recorded.
func (r rbdDevice) removeAccess(volume string) error {
	path := r.accessPath(volume)
	if err := atomicfile.Remove(rbdimage.ClientsPath(path)); err != nil {
		return err
	}
	return atomicfile.Remove(path)
}

// cephClients are the Ceph client addresses of the volume's server, as the
// last server that started recorded them.
func (r rbdDevice) cephClients(volume string) ([]string, error) {
	return rbdimage.ReadClients(r.accessPath(volume))
}

// serverCause gives a server's failure to reach Ceph its kind: a refused
// key is the caller's to fix (FailedPrecondition), unreachable monitors
// may come back (Unavailable).
func serverCause(err error) error {
	switch rbdimage.Cause(err.Error()) {
	case rbdimage.ErrRefused:
		return fmt.Errorf("%w: %w", err, volerr.ErrPrecondition)
	case rbdimage.ErrUnreachable:
		return fmt.Errorf("%w: %w", err, volerr.ErrUnavailable)
	case rbdimage.ErrLocked:
		return fmt.Errorf("%w: %w", err, volerr.ErrInUse)
	}
	return err
}

// access is what the volume's server needs: monitors from the
// StorageCluster, the client from the stage's secrets, the image from the
// Volume (POOL/IMAGE). Nothing is made before it is complete.
func (r rbdDevice) access(ctx context.Context, req attachRequest) (rbdimage.Access, error) {
	return cephAccessFor(ctx, req, r.lookup)
}

// cephAccessFor is what a ceph volume's client needs (rbdDevice.access);
// krbd takes the same.
func cephAccessFor(ctx context.Context, req attachRequest, lookup func(ctx context.Context, host string) ([]string, error)) (rbdimage.Access, error) {
	sc := req.Cluster
	if sc == nil || sc.Spec.Ceph == nil {
		return rbdimage.Access{}, fmt.Errorf("volume %s: its ceph StorageCluster (monitors, pool) is not known to this agent: %w",
			req.Volume, volerr.ErrPrecondition)
	}
	id, key := req.Secrets[secretUserID], req.Secrets[secretUserKey]
	if id == "" || key == "" {
		return rbdimage.Access{}, fmt.Errorf("volume %s of ceph StorageCluster %s: the stage request carries no cephx client (secrets %s and %s): "+
			"its StorageClass must name the cluster's Secret in csi.storage.k8s.io/node-stage-secret-name and -namespace "+
			"(the classes the operator makes do); the Flexvolume driver passes no secrets, use the CSI driver for ceph volumes: %w",
			req.Volume, sc.Name, secretUserID, secretUserKey, volerr.ErrInvalid)
	}
	cfg, err := ceph.ConfigFor(ctx, sc.Spec.Ceph, id, key, lookup)
	if err != nil {
		return rbdimage.Access{}, fmt.Errorf("volume %s: monitors of StorageCluster %s: %w", req.Volume, sc.Name, err)
	}
	pool, image, ok := strings.Cut(req.Image, "/")
	if !ok || pool == "" || image == "" || strings.Contains(image, "/") {
		return rbdimage.Access{}, fmt.Errorf("volume %s: RBD image %q: want POOL/IMAGE: %w", req.Volume, req.Image, volerr.ErrInvalid)
	}
	// A read-only stage (ReadOnlyMany: several nodes at once) takes no
	// exclusive lock: it never writes.
	return rbdimage.Access{MonHost: cfg.Monitors, Client: cfg.Client, Key: key, Pool: pool, Image: image, Exclusive: !req.ReadOnly}, nil
}

func (r rbdDevice) Find(ctx context.Context, volume string) (string, error) {
	in, err := r.inner(volume)
	if err != nil {
		return "", err
	}
	return in.Find(ctx, volume)
}

func (r rbdDevice) Holds(volume, dev string) (bool, error) {
	in, err := r.inner(volume)
	if err != nil {
		return false, err
	}
	h, ok := in.(backingNamer)
	if !ok {
		return false, nil // nbd: the device goes with its server
	}
	return h.Holds(volume, dev)
}

func (r rbdDevice) Detach(ctx context.Context, volume, dev string) error {
	in, err := r.inner(volume)
	if err != nil {
		return err
	}
	return in.Detach(ctx, volume, dev)
}

// Stop stops the server and connection, then removes the access file
// (the key leaves the node with the volume).
func (r rbdDevice) Stop(ctx context.Context, volume string) error {
	in, err := r.inner(volume)
	if err != nil {
		return err
	}
	if err := in.Stop(ctx, volume); err != nil {
		return err
	}
	if err := r.removeAccess(volume); err != nil {
		return fmt.Errorf("remove access file of %s: %w", volume, err)
	}
	return nil
}

func (r rbdDevice) Serving(ctx context.Context, volume string) (HealResult, bool) {
	in, err := r.inner(volume)
	if err != nil {
		return "", false
	}
	return in.Serving(ctx, volume)
}

// Heal starts a server with the access file the stage left; image only
// checks that the volume still exists.
func (r rbdDevice) Heal(ctx context.Context, volume string, image func(context.Context) (string, error)) (HealResult, error) {
	in, err := r.inner(volume)
	if err != nil {
		return HealSkipped, err
	}
	path := r.accessPath(volume)
	return in.Heal(ctx, volume, func(ctx context.Context) (string, error) {
		if _, err := image(ctx); err != nil {
			return "", err
		}
		if _, err := os.Stat(path); err != nil {
			return "", fmt.Errorf("volume %s: its access file %s (the cephx key from its stage) is gone, so no server can "+
				"reach its RBD image: its I/O waits until it is staged anew: %w", volume, path, err)
		}
		return rbdimage.Spec(path), nil
	})
}

// Expand: the server reads the RBD image's new size from librbd.
func (r rbdDevice) Expand(ctx context.Context, volume string) (string, error) {
	in, err := r.inner(volume)
	if err != nil {
		return "", err
	}
	return in.Expand(ctx, volume)
}

func (r rbdDevice) Condition(ctx context.Context, volume string) (bool, string) {
	in, err := r.inner(volume)
	if err != nil {
		return true, err.Error()
	}
	return in.Condition(ctx, volume)
}
