package agent

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/go-logr/logr"

	"github.com/berth-io/berth/internal/blockdev/launch"
	"github.com/berth-io/berth/internal/blockdev/rbdimage"
	"github.com/berth-io/berth/internal/keeper"
	"github.com/berth-io/berth/internal/volmap"
)

// Keeper is the part of the keeper client (internal/keeper) the agent uses.
type Keeper interface {
	Ping(ctx context.Context) error
	List(ctx context.Context) ([]keeper.Volume, error)
	// Status is one volume's entry of List (found false: not held).
	Status(ctx context.Context, volume string) (v keeper.Volume, found bool, err error)
	Close(ctx context.Context, volume string) error
	// Stop ends the volume's server through the keeper's handle on it.
	Stop(ctx context.Context, volume string) error
}

// Server is a started blockdev server process (launch.Process).
type Server interface {
	// PID is the server's pid in this process's PID namespace (for logs).
	PID() int
	// Stop ends the server through the handle this process holds on its
	// child (never a pid number that may name another process by now).
	Stop(timeout time.Duration) error
}

// servers are the blockdev servers this agent process started, by volume:
// it stops them through its own handles. Servers an earlier agent started
// are stopped through the keeper (FUSE), whose pids are of its PID
// namespace, not necessarily this one.
type servers = volmap.Map[Server]

// StartServer adapts launch.Start to UserspaceConfig.Start.
func StartServer(ctx context.Context, p launch.Params) (Server, error) {
	proc, err := launch.Start(ctx, p)
	if err != nil {
		return nil, err
	}
	return proc, nil
}

// UserspaceConfig enables volumes with mounter userspace: a berth blockdev
// server per volume serves the volume's image to the kernel, through FUSE
// (<Root>/<volume>/disk.img, with a loop device on it), nbd or ublk.
type UserspaceConfig struct {
	// Root holds one FUSE mountpoint and one server log per volume, and
	// the volumes' records (device_record.go). Required, absolute; the
	// keeper must see it at the same path.
	Root string
	// Binary is the berth executable that runs the servers.
	Binary string
	// SlimBinary, when set, runs the servers of file images instead
	// (launch.SlimBinary): an agent restart starts them all at once, and
	// it is the cheaper one to start. Rbd images need librbd: CephBinary,
	// when set (launch.CephBinary), else Binary.
	SlimBinary, CephBinary string
	// KeeperSocket is the keeper's socket, named in errors that tell
	// how to fix a keeper this agent cannot reach or see.
	KeeperSocket string
	// Keeper holds the FUSE connections across server restarts (required).
	Keeper Keeper
	// Start runs a server (launch.Start through StartServer; required);
	// StopPID stops an nbd or ublk server this agent found in its own /proc
	// (launch.StopPID); CheckMount checks a live connection.
	Start      func(ctx context.Context, p launch.Params) (Server, error)
	StopPID    func(pid int, timeout time.Duration, still func() bool) error
	CheckMount func(mountpoint string) error
	// FUSEMounted tells whether this agent sees a FUSE mount at a
	// volume's mountpoint (nil: this process's mount table).
	FUSEMounted func(mountpoint string) (bool, error)
	// Workers is the request workers per server (0: the server's default).
	Workers int
	// Passthrough lets the kernel do data I/O on the image (kernel 6.9+;
	// the server falls back to serving it when the kernel does not offer it).
	Passthrough bool
	// StopTimeout is how long a server gets to exit before it is killed
	// (0: 10s).
	StopTimeout time.Duration
	// Transport serves new userspace volumes over FUSE + loop (default),
	// nbd or ublk; a staged volume keeps the transport it was staged with.
	Transport Transport
	// NBD is the kernel nbd driver; required with Transport nbd (nil
	// otherwise: staging over nbd, which a StorageCluster may ask for,
	// is refused as unavailable).
	NBD NBD
	// DeadConnTimeout is how long the kernel queues an nbd device's I/O
	// while no server is connected; then I/O fails until a server
	// reconnects (the device stays until it is disconnected); 0: the
	// server's default.
	DeadConnTimeout time.Duration
	// Ublk is the kernel ublk driver (nil: staging over ublk, which a
	// StorageCluster may ask for, is refused as unavailable).
	Ublk Ublk
	// ProcRoot is where processes are listed ("" is /proc).
	ProcRoot string
}

// withDefaults checks c and fills in what its zero values mean.
func (c UserspaceConfig) withDefaults() (UserspaceConfig, error) {
	var errs []error
	if !filepath.IsAbs(c.Root) {
		errs = append(errs, fmt.Errorf("Root %q is not an absolute path", c.Root))
	}
	if c.Keeper == nil {
		errs = append(errs, errors.New("Keeper is nil (required)"))
	}
	if c.Start == nil {
		errs = append(errs, errors.New("Start is nil (required)"))
	}
	if c.Transport != "" {
		if _, err := ParseTransport(string(c.Transport)); err != nil {
			errs = append(errs, err)
		}
	}
	if c.Transport == TransportNBD && c.NBD == nil {
		errs = append(errs, errors.New("Transport nbd needs NBD"))
	}
	if c.Workers < 0 || c.StopTimeout < 0 || c.DeadConnTimeout < 0 {
		errs = append(errs, fmt.Errorf("negative Workers %d, StopTimeout %v or DeadConnTimeout %v", c.Workers, c.StopTimeout, c.DeadConnTimeout))
	}
	if c.StopTimeout == 0 {
		c.StopTimeout = 10 * time.Second
	}
	if c.FUSEMounted == nil {
		c.FUSEMounted = hostFUSEMounted
	}
	if c.NBD == nil {
		c.NBD = noNBD{}
	}
	if c.Ublk == nil {
		c.Ublk = noUblk{}
	}
	return c, errors.Join(errs...)
}

// noNBD is the nbd driver of an agent given none.
type noNBD struct{}

func (noNBD) Available() (bool, string)           { return false, "the agent was started without an nbd driver" }
func (noNBD) Device(string) (string, bool, error) { return "", false, nil }
func (noNBD) Disconnect(string) error             { return nil }

// ErrKeeperDown means that the keeper does not answer, so userspace volumes of this
// node have lost (or cannot get) their FUSE connection.
var ErrKeeperDown = errors.New("berth keeper is not running")

// ErrConnectionLost means that the volume's kernel connection is gone (the
// keeper no longer holds its FUSE connection, or the kernel no longer has
// its nbd device), so the volume's I/O fails until it is staged anew.
var ErrConnectionLost = errors.New("the volume's kernel connection is lost")

// userspace is what the transports with blockdev servers share: their
// settings, the servers this agent process started, and the records.
type userspace struct {
	cfg     *UserspaceConfig
	procs   *servers
	records records
	node    string
	log     logr.Logger
	netns   holderNS
}

// start starts a blockdev server for p.Volume (either transport) with its
// output appended to the volume's server log.
func (u userspace) start(ctx context.Context, p launch.Params) (Server, error) {
	if err := os.MkdirAll(u.cfg.Root, 0o700); err != nil {
		return nil, fmt.Errorf("userspace root: %w", err)
	}
	// A file, not a pipe: the server outlives the agent and must not die of
	// SIGPIPE when the agent is gone.
	logPath := serverLog(u.cfg.Root, p.Volume)
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, fmt.Errorf("server log of %s: %w", p.Volume, err)
	}
	defer func() { _ = logf.Close() }()
	rec, _, err := u.records.load(p.Volume)
	if err != nil {
		return nil, err
	}
	if rec.Holders != "" {
		ns, err := u.netns.open(p.Volume, rec.Holders, noServerMade)
		if err != nil {
			return nil, err
		}
		defer func() { _ = ns.Close() }()
		p.NetNS = ns
	}
	p.Binary, p.Workers, p.Stderr = u.cfg.Binary, u.cfg.Workers, logf
	p.IOErrorsFile = ioErrorsFile(u.cfg.Root, p.Volume)
	// A heal pass holds the I/O of the servers it starts until all are
	// started (launch.HoldGroup).
	p.Hold = launch.HoldFrom(ctx)
	switch rbd := strings.HasPrefix(p.Image, rbdimage.Prefix); {
	case rbd && u.cfg.CephBinary != "":
		p.Binary = u.cfg.CephBinary
	case !rbd && u.cfg.SlimBinary != "":
		p.Binary = u.cfg.SlimBinary
	}
	proc, err := u.cfg.Start(ctx, p)
	if err != nil {
		return nil, fmt.Errorf("start blockdev server of %s (log %s): %w", p.Volume, logPath, err)
	}
	u.procs.Put(p.Volume, proc)
	u.log.Info("blockdev server started", "volume", p.Volume, "transport", p.Transport, "pid", proc.PID(), "holders", rec.Holders)
	return proc, nil
}

// findServer finds the volume's running server of transport t (nbd or
// ublk, whose servers the kernel's device outlives): by the pid in its
// record, else (a crash between start and record) by scanning the process
// table. A pid counts only while its command line still names the volume
// and the transport.
func (u userspace) findServer(volume string, t Transport) (pid int, found bool, err error) {
	rec, _, err := u.records.load(volume)
	if err != nil {
		return 0, false, err
	}
	if u.serves(rec.ServerPID, volume, t) {
		return rec.ServerPID, true, nil
	}
	entries, err := os.ReadDir(u.procRoot())
	if err != nil {
		return 0, false, fmt.Errorf("list processes: %w", err)
	}
	for _, e := range entries {
		if pid, err := strconv.Atoi(e.Name()); err == nil && u.serves(pid, volume, t) {
			return pid, true, nil
		}
	}
	return 0, false, nil
}

func (u userspace) procRoot() string {
	if u.cfg.ProcRoot != "" {
		return u.cfg.ProcRoot
	}
	return "/proc"
}

// serves tells whether pid is a berth blockdev server of volume over t.
func (u userspace) serves(pid int, volume string, t Transport) bool {
	if pid <= 0 {
		return false
	}
	b, err := os.ReadFile(filepath.Join(u.procRoot(), strconv.Itoa(pid), "cmdline"))
	if err != nil {
		return false
	}
	args := strings.Split(string(bytes.TrimRight(b, "\x00")), "\x00")
	pair := func(flag, val string) bool {
		i := slices.Index(args, flag)
		return (i >= 0 && i+1 < len(args) && args[i+1] == val) || slices.Contains(args, flag+"="+val)
	}
	return slices.Contains(args, "blockdev") && pair("--volume", volume) && pair("--transport", string(t))
}

// stopServer stops the volume's server of transport t: the one this agent
// process started, through its handle, and one an earlier agent started,
// found in this agent's own /proc by its command line (so the pid is of
// this PID namespace). Idempotent.
func (u userspace) stopServer(volume string, t Transport) error {
	if p := u.procs.Take(volume); p != nil {
		if err := p.Stop(u.cfg.StopTimeout); err != nil {
			return fmt.Errorf("stop %s blockdev server of %s: %w", t, volume, err)
		}
	}
	pid, found, err := u.findServer(volume, t)
	if err != nil {
		return err
	}
	if found {
		still := func() bool { return u.serves(pid, volume, t) }
		if err := u.cfg.StopPID(pid, u.cfg.StopTimeout, still); err != nil {
			return fmt.Errorf("stop %s blockdev server of %s: %w", t, volume, err)
		}
	}
	return nil
}

// restartServer starts a server for a staged volume whose server is gone;
// image is looked up only now, when one must start.
func restartServer(ctx context.Context, volume string, image func(context.Context) (string, error),
	start func(ctx context.Context, volume, image string) error) (HealResult, error) {
	img, err := image(ctx)
	if err != nil {
		return HealSkipped, err
	}
	if err := start(ctx, volume, img); err != nil {
		return HealSkipped, err
	}
	return HealRestarted, nil
}
