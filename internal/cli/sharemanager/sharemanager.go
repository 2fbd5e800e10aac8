// Package sharemanager is the `berth share-manager` command: one per RWX
// volume. It waits for the volume's device, mounts it, serves it over NFS
// with nfs-ganesha, renews its Lease, and exits non-zero on any failure so
// that the controller starts a new one.
package sharemanager

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/clock"
	"k8s.io/utils/exec"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/berth-io/berth/api/v1alpha1"
	"github.com/berth-io/berth/internal/cli/kube"
	"github.com/berth-io/berth/internal/mount"
	"github.com/berth-io/berth/internal/share"
	"github.com/berth-io/berth/internal/share/nfsclient"
)

// RecoveryDirName is the folder on the volume that keeps ganesha's client
// records, so that a new share manager, on any node, lets the clients of
// the old one reclaim their state.
const RecoveryDirName = ".berth-nfs-recovery"

// Config is the share manager's flags.
type Config struct {
	// Volume names the volume; the export is /<Volume>.
	Volume string
	// Device is the volume's block device; MountPath where it is mounted
	// (formatted as FSType first when blank).
	Device, MountPath, FSType string
	// StateDir keeps ganesha's config, pid file and log.
	StateDir string
	// readyCheck: only check the ready file of StateDir (--ready);
	// aliveCheck: only check its heartbeat (--alive), at most AliveWithin old.
	readyCheck, aliveCheck bool
	AliveWithin            time.Duration
	// HealthAddr serves the same two checks over HTTP ("" or "0": not):
	// kubelet's HTTP probes exec nothing in the pod.
	HealthAddr string
	// RecoveryDir is the recovery backend's root ("": on the volume).
	RecoveryDir string
	BindAddr    string
	Port        int
	// LeaseLifetime, GracePeriod and MinorVersions are the NFSv4 ones.
	LeaseLifetime, GracePeriod time.Duration
	MinorVersions              []int
	SyncWrites                 bool
	// DeviceTimeout bounds the wait for the device.
	DeviceTimeout time.Duration
	CheckInterval time.Duration
	// Lease is taken once the device is there and renewed until the stop;
	// no name: no lease (outside Kubernetes).
	Lease share.LeaseConfig
	// ShareManager names the ShareManager (in the Lease's namespace) whose
	// spec.clients are the addresses admitted; none: only Clients.
	ShareManager string
	// Clients are admitted besides those of the ShareManager.
	Clients []string
	// RootSquash maps clients' root to the anonymous user.
	RootSquash bool
	// NeverFormat, when set, says why the volume must hold a filesystem
	// already (it had one, or it is a copy): a device that shows none is
	// then damage or a failed read, and the stage fails instead of making
	// a new filesystem over the data.
	NeverFormat string
	Kube        kube.Flags
	Log         logr.Logger

	// Seams; nil: the real ones.
	Exec    share.Exec
	Clock   clock.WithTicker
	Mounter *mount.Manager
	Leases  kubernetes.Interface
	Shares  client.WithWatch
}

// ReadyFile is the file a readiness probe tests: present while serving.
func (c Config) ReadyFile() string { return filepath.Join(c.StateDir, "ready") }

// checkReady is the readiness probe (--ready): the image has no shell or
// test(1), so berth itself looks for the ready file.
func (c Config) checkReady() error {
	if _, err := os.Stat(c.ReadyFile()); err != nil {
		return fmt.Errorf("not serving: %w", err)
	}
	return nil
}

func (c Config) export() share.ExportConfig {
	rec := c.RecoveryDir
	if rec == "" {
		rec = filepath.Join(c.MountPath, RecoveryDirName)
	}
	return share.ExportConfig{
		Path: filepath.Clean(c.MountPath), Pseudo: "/" + c.Volume,
		BindAddr: c.BindAddr, Port: c.Port, RecoveryRoot: rec,
		LeaseLifetime: c.LeaseLifetime, GracePeriod: c.GracePeriod,
		MinorVersions: c.MinorVersions, SyncWrites: c.SyncWrites,
		Clients: c.Clients, RootSquash: c.RootSquash,
	}
}

func (c Config) validate() error {
	var errs []error
	if c.Volume == "" || strings.ContainsAny(c.Volume, "/\"; \n") {
		errs = append(errs, fmt.Errorf("--volume %q: a volume name", c.Volume))
	}
	for flag, p := range map[string]string{"--device": c.Device, "--mount-path": c.MountPath, "--state-dir": c.StateDir} {
		if !filepath.IsAbs(p) {
			errs = append(errs, fmt.Errorf("%s %q: an absolute path", flag, p))
		}
	}
	if _, err := c.export().Render(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// Run serves until ctx ends (SIGTERM: stops ganesha, unmounts, releases
// the lease, returns nil) or something fails (same cleanup, returns the
// reason).
func (c Config) Run(ctx context.Context) (err error) {
	if err := c.validate(); err != nil {
		return err
	}
	if c.Exec == nil {
		c.Exec = share.OSExec{}
	}
	if c.Clock == nil {
		c.Clock = clock.RealClock{}
	}
	if c.Mounter == nil {
		c.Mounter = mount.NewManager(mount.NewMounter(), exec.New(), c.Log.WithName("mount"))
	}
	defer func() {
		if err != nil {
			c.Log.Error(err, "share manager failed")
		}
	}()
	_ = os.Remove(c.ReadyFile())
	defer c.heartbeat(ctx)()
	stopProbes, err := c.serveProbes(ctx)
	if err != nil {
		return err
	}
	defer stopProbes()
	if err := c.waitDevice(ctx); err != nil {
		return err
	}
	lease, err := c.lease()
	if err != nil {
		return err
	}
	if lease != nil {
		if err := lease.Acquire(ctx); err != nil {
			return err
		}
		defer func() {
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
			defer cancel()
			if err := lease.Release(rctx); err != nil {
				c.Log.Info("could not release the lease; it lapses instead", "err", err.Error())
			}
		}()
		// Renewals run from here on, through the stage and every serve:
		// a start slower than the Lease (a busy node, a long mkfs or fsck)
		// must not read as a dead share manager and be failed over again
		// and again. They stop before the release above.
		var stop func()
		ctx, stop = renewing(ctx, lease)
		defer func() {
			stop()
			if cause := context.Cause(ctx); errors.Is(cause, share.ErrLeaseLost) && !errors.Is(err, share.ErrLeaseLost) {
				err = errors.Join(cause, err)
			}
		}()
	}
	clients := &admitted{extra: c.Clients}
	if lease != nil {
		// The next renewal tells the controller, and through the Volume
		// the nodes, whom ganesha admits: a node mounts once listed.
		clients.report = func(nodes []string) { lease.Annotate(v1.ShareClientsAnnotation, strings.Join(nodes, ",")) }
	}
	if err := clients.set(nil); err != nil {
		return err
	}
	if c.ShareManager != "" {
		cl, err := c.shares()
		if err != nil {
			return err
		}
		if err := c.loadClients(ctx, cl, clients, c.DeviceTimeout); err != nil {
			return err
		}
		fctx, stop := context.WithCancel(ctx)
		defer stop()
		go c.followClients(fctx, cl, clients)
	}
	if err := c.stage(ctx); err != nil {
		return err
	}
	defer c.unmount(ctx)
	for {
		err := c.serve(ctx, lease, clients)
		if !errors.Is(err, errGrowAtStage) {
			return err
		}
		// Staged again, the filesystem grows unmounted; ganesha's client
		// records are on the volume, so clients reclaim their state in
		// the grace period of the next ganesha, as after a failover.
		c.Log.Info("serving again after a new stage, which grows the filesystem", "reason", err.Error())
		if _, err := c.Mounter.Unstage(ctx, c.MountPath); err != nil {
			return fmt.Errorf("unmount %s to grow it: %w", c.MountPath, err)
		}
		if err := c.stage(ctx); err != nil {
			return err
		}
	}
}

// renewing renews lease until stop is called; a lost lease cancels the
// returned context with the loss as its cause (ganesha is then killed, a
// stage under way stops).
func renewing(ctx context.Context, lease *share.Lease) (_ context.Context, stop func()) {
	ctx, cancel := context.WithCancelCause(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := lease.Renew(ctx); err != nil {
			cancel(err)
		}
	}()
	return ctx, func() { cancel(nil); <-done }
}

// stage mounts the device (formatting it when blank and allowed, growing
// its filesystem to the device's size).
func (c Config) stage(ctx context.Context) error {
	// The format rules of every stage (F11): the operator passes Never
	// when the Volume records a filesystem or is a copy. The image file is
	// not in this pod; blkid and the device's zero ends still guard.
	policy := mount.FormatPolicy{Never: c.NeverFormat != "", Why: c.NeverFormat}
	if err := c.Mounter.Stage(ctx, mount.StageRequest{VolumeID: c.Volume, Device: c.Device, StagingPath: c.MountPath, FSType: c.FSType, Format: policy}); err != nil {
		return fmt.Errorf("mount %s: %w", c.Device, err)
	}
	return nil
}

// cleanupTimeout bounds each step of the cleanup after ctx ended.
const cleanupTimeout = 30 * time.Second

func (c Config) serve(ctx context.Context, lease *share.Lease, clients *admitted) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	ep := c.export()
	check, closeCheck := c.exportCheck(ep)
	defer closeCheck()
	srv := share.NewServer(share.ServerConfig{Export: ep, Dir: c.StateDir, CheckInterval: c.CheckInterval}, c.Exec, c.Clock,
		share.Checks{Device: share.DeviceCheck(c.Device, c.MountPath, "/proc/self/mountinfo"), Export: check}, c.Log.WithName("server"))
	done, err := clients.serve(srv)
	if err != nil {
		return err
	}
	defer done()
	sizeDone := make(chan struct{})
	go func() {
		defer close(sizeDone)
		if err := c.watchSize(ctx, func(size int64) {
			if lease != nil {
				lease.Annotate(v1.ShareSizeAnnotation, strconv.FormatInt(size, 10))
			}
		}); err != nil {
			cancel(err)
		}
	}()
	err = srv.Run(ctx, func() {
		if err := os.WriteFile(c.ReadyFile(), []byte(ep.Pseudo+"\n"), 0o644); err != nil {
			c.Log.Info("could not write the ready file", "err", err.Error())
		}
		c.Log.Info("serving", "export", ep.Pseudo, "endpoint", ep.Endpoint(), "device", c.Device)
	})
	_ = os.Remove(c.ReadyFile())
	cancel(nil)
	<-sizeDone
	if err == nil && context.Cause(ctx) != nil && !errors.Is(context.Cause(ctx), context.Canceled) {
		err = context.Cause(ctx)
	}
	return err
}

// exportCheck asks the local ganesha for the export with sessions (the
// lowest minor version from 4.1 on that it serves), or through the NFSv4.0
// client when it serves 4.0 only.
func (c Config) exportCheck(ep share.ExportConfig) (share.Check, func()) {
	const machine = "berth-share-manager-check"
	addr := ep.LocalEndpoint()
	minor := uint32(1)
	if len(ep.MinorVersions) > 0 {
		minor = 0
		for _, v := range ep.MinorVersions {
			if v > 0 && (minor == 0 || uint32(v) < minor) {
				minor = uint32(v)
			}
		}
	}
	if minor > 0 {
		return func(ctx context.Context) error {
			return nfsclient.CheckExport41(ctx, addr, ep.Pseudo, minor, machine)
		}, func() {}
	}
	cl := nfsclient.New(nfsclient.Endpoint{Addr: addr, Export: ep.Pseudo},
		nfsclient.Options{OpTimeout: 5 * time.Second, MachineName: machine}, c.Clock, c.Log.WithName("check"))
	return cl.Check, cl.Close
}

func (c Config) unmount(ctx context.Context) {
	uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer cancel()
	if _, err := c.Mounter.Unstage(uctx, c.MountPath); err != nil {
		c.Log.Error(err, "unmount failed", "path", c.MountPath)
		return
	}
	c.Log.Info("unmounted", "path", c.MountPath)
}

// The share manager's only API calls are its Lease's (share.Lease: get,
// create, update), in the berth namespace where its pod runs.
// +kubebuilder:rbac:groups=coordination.k8s.io,namespace=berth-system,resources=leases,verbs=get;create;update

func (c Config) lease() (*share.Lease, error) {
	if c.Lease.Name == "" {
		c.Log.Info("no --lease-name: renewing no lease")
		return nil, nil
	}
	cs := c.Leases
	if cs == nil {
		rc, err := c.Kube.RestConfig()
		if err != nil {
			return nil, err
		}
		if cs, err = kubernetes.NewForConfig(rc); err != nil {
			return nil, err
		}
	}
	return share.NewLease(c.Lease, cs.CoordinationV1(), c.Clock, c.Log.WithName("lease"))
}
