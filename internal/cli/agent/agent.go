// Package agent is the `berth agent` command: the node agent. It serves the
// CSI Identity and Node services, registers with kubelet, reconciles the
// images of this node's Volumes and Snapshots, and reports free capacity.
package agent

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/clock"
	utilexec "k8s.io/utils/exec"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/apiutil"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	v1 "github.com/berth-io/berth/api/v1alpha1"
	nodeagent "github.com/berth-io/berth/internal/agent"
	"github.com/berth-io/berth/internal/agent/socket"
	"github.com/berth-io/berth/internal/backend"
	"github.com/berth-io/berth/internal/blockdev"
	"github.com/berth-io/berth/internal/blockdev/launch"
	"github.com/berth-io/berth/internal/blockdev/ublk"
	"github.com/berth-io/berth/internal/capacity"
	"github.com/berth-io/berth/internal/cli"
	"github.com/berth-io/berth/internal/cli/kube"
	"github.com/berth-io/berth/internal/controller"
	"github.com/berth-io/berth/internal/csi"
	"github.com/berth-io/berth/internal/fence"
	"github.com/berth-io/berth/internal/flexvolume"
	"github.com/berth-io/berth/internal/heal"
	"github.com/berth-io/berth/internal/keeper"
	"github.com/berth-io/berth/internal/metrics"
	"github.com/berth-io/berth/internal/mount"
	"github.com/berth-io/berth/internal/nbd"
	"github.com/berth-io/berth/internal/network"
	"github.com/berth-io/berth/internal/nodepath"
	"github.com/berth-io/berth/internal/scheme"
	"github.com/berth-io/berth/internal/version"
)

// The agent's endpoints. It runs on the host network: ports that other
// node daemons (kubelet 10248/10250, kube-proxy 10249/10256, node-exporter
// 9100, CSI livenessprobe sidecars 9808) do not take.
const (
	DefaultMetricsAddr = ":9741"
	DefaultHealthAddr  = ":9742"
)

// agentMetrics are the agent's metric groups, registered on
// controller-runtime's registry, which the manager's metrics server serves.
type agentMetrics struct {
	csi, flex *metrics.Ops
	fence     *metrics.Fence
	heal      *metrics.Heal
	cleanup   *metrics.Cleanup
	driver    *metrics.FlexDriver
}

func newAgentMetrics() (agentMetrics, error) {
	var m agentMetrics
	var err error
	reg := ctrlmetrics.Registry
	if m.csi, err = metrics.NewOps(reg, metrics.BoundaryCSI); err != nil {
		return m, err
	}
	if m.flex, err = metrics.NewOps(reg, metrics.BoundaryFlexvolume); err != nil {
		return m, err
	}
	if m.fence, err = metrics.NewFence(reg); err != nil {
		return m, err
	}
	if m.heal, err = metrics.NewHeal(reg); err != nil {
		return m, err
	}
	if m.cleanup, err = metrics.NewCleanup(reg); err != nil {
		return m, err
	}
	if err = metrics.NewBuildInfo(reg, version.Get()); err != nil {
		return m, err
	}
	m.driver, err = metrics.NewFlexDriver(reg)
	return m, err
}

// Config of the node agent.
type Config struct {
	NodeName string
	// Namespace is berth's namespace, where this node's CSIStorageCapacity
	// objects live.
	Namespace string
	// DataDirs are the data dirs of every StorageCluster this agent serves
	// (one local backend each); a volume's images live in its cluster's.
	DataDirs []string
	// RunDir holds node-wide state that belongs to no cluster's data dir:
	// the blockdev servers' FUSE mount points and the Flexvolume staging
	// folders. The keeper must see it (its FUSE mounts live there).
	RunDir string
	// CSIEndpoint is where the CSI Identity + Node services listen.
	CSIEndpoint string
	// KubeletDir is kubelet's root; empty disables plugin registration.
	KubeletDir string
	// AgentSocket is the root-only local API the Flexvolume driver calls.
	AgentSocket string
	// VolumePluginDir is kubelet's Flexvolume folder; empty: do not install.
	VolumePluginDir  string
	CapacityInterval time.Duration
	// StaleInterval is how often this node's stale-attachment list is worked.
	StaleInterval time.Duration
	// MetricsAddr serves /metrics, HealthAddr /healthz and /readyz; "0"
	// turns either off.
	MetricsAddr string
	HealthAddr  string
	// MetricsSecure serves /metrics over HTTPS to authorized readers only
	// (metrics.ServerOptions): the agent's is on the node's address.
	MetricsSecure bool
	// KeeperSocket is the keeper holding userspace volumes' FUSE connections.
	KeeperSocket string
	// HolderNetnsDir holds the holder records of clusters in the multus
	// netns mode, one folder per cluster (the operator's hostPath).
	HolderNetnsDir string
	// BlockdevBinary runs `blockdev` servers; empty: this executable.
	BlockdevBinary      string
	BlockdevPassthrough bool
	BlockdevWorkers     int
	// UserspaceTransport serves newly staged userspace volumes over FUSE +
	// loop, nbd, ublk or auto (ublk where the kernel has it, else FUSE),
	// where their StorageCluster names none; NBDDeadConnTimeout is how long the kernel keeps an nbd
	// device while no server is connected.
	UserspaceTransport string
	NBDDeadConnTimeout time.Duration
	// HealInterval is how often staged userspace volumes are checked (and
	// their servers restarted) after the pass at start; 0: only at start.
	HealInterval time.Duration
	// ToolTimeouts bound blkid, mkfs, fsck, resize and losetup.
	ToolTimeouts mount.Timeouts
	// LockWait bounds how long the stale-entry cleanup waits for a busy volume
	// before it retries it later.
	LockWait time.Duration
	Rest     *rest.Config
	Log      logr.Logger
}

// A secure metrics endpoint (--metrics-secure) asks the API server who
// each reader is and whether it may get /metrics.
// +kubebuilder:rbac:groups=authentication.k8s.io,resources=tokenreviews,verbs=create
// +kubebuilder:rbac:groups=authorization.k8s.io,resources=subjectaccessreviews,verbs=create

// Folders under the run dir: the userspace volumes' servers and records,
// and the freeze records.
const (
	userspaceDir = "blockdev"
	freezeDir    = "freeze"
)

// Run serves until ctx ends.
func (c Config) Run(ctx context.Context) error {
	if c.NodeName == "" {
		return errors.New("node name missing: set --node-name or NODE_NAME")
	}
	for _, d := range c.DataDirs {
		if err := v1.ValidateDataDir(d); err != nil {
			return fmt.Errorf("--data-dir: %w", err)
		}
	}
	if !filepath.IsAbs(c.RunDir) || filepath.Clean(c.RunDir) != c.RunDir || c.RunDir == "/" {
		return fmt.Errorf("--run-dir %q: want a clean absolute path other than /", c.RunDir)
	}
	// Before anything can heal, clean up or unstage: records this agent
	// cannot read (another release's) stop it here, saying which.
	if err := nodeagent.CheckRecords(filepath.Join(c.RunDir, userspaceDir), filepath.Join(c.RunDir, freezeDir)); err != nil {
		return fmt.Errorf("refusing to start on node %s: %w", c.NodeName, err)
	}
	s, err := scheme.New()
	if err != nil {
		return err
	}
	mine := labels.SelectorFromSet(labels.Set{v1.NodeLabel: c.NodeName})
	mgr, err := ctrl.NewManager(c.Rest, ctrl.Options{
		Scheme:                 s,
		Logger:                 c.Log,
		Metrics:                metrics.ServerOptions(c.MetricsAddr, c.MetricsSecure),
		HealthProbeBindAddress: c.HealthAddr,
		// berth's kinds are known without the API server, so the agent is
		// built, and heals its volumes, while the API server is away.
		MapperProvider: func(cfg *rest.Config, hc *http.Client) (meta.RESTMapper, error) {
			dynamic, err := apiutil.NewDynamicRESTMapper(cfg, hc)
			if err != nil {
				return nil, err
			}
			return scheme.WithBerthKinds(dynamic), nil
		},
		// Each agent caches only its own node's volumes and snapshots.
		Cache: cache.Options{ByObject: map[client.Object]cache.ByObject{
			&v1.Volume{}:   {Label: mine},
			&v1.Snapshot{}: {Label: mine},
		}},
	})
	if err != nil {
		return fmt.Errorf("manager: %w", err)
	}
	m, err := newAgentMetrics()
	if err != nil {
		return err
	}
	if err := mgr.AddHealthzCheck("ping", healthz.Ping); err != nil {
		return err
	}
	images, err := backend.NewSet(c.DataDirs, volumePlace(mgr.GetClient()), c.Log.WithName("backend"))
	if err != nil {
		return err
	}
	exec := mount.NewTools(utilexec.New(), c.ToolTimeouts)
	// Fencing reads the API server directly: a cache a moment behind would
	// turn every hand-over into conflict retries, and a list of what this
	// node holds must include what was written a moment ago.
	direct, err := client.New(c.Rest, client.Options{Scheme: s})
	if err != nil {
		return fmt.Errorf("kubernetes client: %w", err)
	}
	mounts := mount.NewManager(mount.NewMounter(), exec, c.Log.WithName("mount"))
	fencer := fence.New(direct, mgr.GetEventRecorderFor("berth-agent"), clock.RealClock{}, c.Log.WithName("fence"), fence.Options{Metrics: m.fence, AskOperator: true})
	flexStaging := filepath.Join(c.RunDir, "flex-staging")
	paths, err := nodepath.New(c.KubeletDir, flexStaging)
	if err != nil {
		return fmt.Errorf("--kubelet-dir, --run-dir: %w", err)
	}
	us, err := c.userspace()
	if err != nil {
		return err
	}
	a, err := nodeagent.New(nodeagent.Config{
		Node: c.NodeName, API: mgr.GetAPIReader(), Volumes: mgr.GetClient(), Images: images, Loop: mount.NewLoop(exec),
		Mounts: mounts, Fence: fencer,
		Log: c.Log.WithName("agent"), LockWait: c.LockWait, Paths: paths,
		Flex:   nodeagent.FlexConfig{StagingRoot: flexStaging, Holdings: fencer},
		Status: direct, Clock: clock.RealClock{}, Events: mgr.GetEventRecorderFor("berth-agent"),
		Userspace: us, FreezeDir: filepath.Join(c.RunDir, freezeDir), Netns: nodeagent.NetnsConfig{Dir: c.HolderNetnsDir},
	})
	if err != nil {
		return err
	}
	// A filesystem an earlier agent froze for a copy and died before the
	// thaw stays frozen for good: thaw it before anything else runs.
	if n, err := a.ThawLeftovers(ctx); err != nil {
		c.Log.Error(err, "thaw filesystems left frozen by an earlier agent", "thawed", n)
	} else if n > 0 {
		c.Log.Info("thawed filesystems left frozen by an earlier agent", "thawed", n)
	}
	// Snapshots and clones hold their source still through the agent.
	images.WithQuiescer(a)
	if err := mgr.Add(&heal.Healer{Node: c.NodeName, Holdings: fencer, Volumes: a, Local: a.StagedHere,
		Recorder: mgr.GetEventRecorderFor("berth-agent"), Log: c.Log.WithName("heal"), Interval: c.HealInterval, Metrics: m.heal}); err != nil {
		return err
	}
	// The node gauges read the cache of this node's Volumes at scrape time.
	if _, err := metrics.NewNode(ctrlmetrics.Registry, nodeagent.NodeMetrics{Agent: a, Volumes: mgr.GetClient(), Usage: images.Usage}, c.Log.WithName("metrics")); err != nil {
		return err
	}

	if err := (&controller.VolumeReconciler{Client: mgr.GetClient(), Node: c.NodeName, Backend: images,
		Loop: mount.NewLoop(exec), Attachments: direct, Recorder: mgr.GetEventRecorderFor("berth-agent"), Log: c.Log.WithName("volume")}).SetupWithManager(mgr); err != nil {
		return err
	}
	if err := (&controller.SnapshotReconciler{Client: mgr.GetClient(), Node: c.NodeName, Backend: images, Log: c.Log.WithName("snapshot")}).SetupWithManager(mgr); err != nil {
		return err
	}
	if err := (&controller.ClusterCleanupReconciler{Client: mgr.GetClient(), Node: c.NodeName, Detacher: a,
		Recorder: mgr.GetEventRecorderFor("berth-agent"), Log: c.Log.WithName("clustercleanup")}).SetupWithManager(mgr); err != nil {
		return err
	}
	// Any node may mount any share, a local volume's too, and a ceph
	// volume's share manager may run on any node: the share mounts and
	// devices are checked from a cache of the shared Volumes besides this
	// node's own.
	sharedVolumes, err := cache.New(c.Rest, cache.Options{Scheme: s, Mapper: mgr.GetRESTMapper(), ByObject: map[client.Object]cache.ByObject{
		&v1.Volume{}: {Label: controller.SharedVolumes()},
	}})
	if err != nil {
		return fmt.Errorf("cache of shared volumes: %w", err)
	}
	if err := mgr.Add(sharedVolumes); err != nil {
		return err
	}
	// Uncached: it reads a pod only when a share failed over (the agent
	// may get and delete pods, not list or watch them).
	if err := (&controller.ShareMountReconciler{Client: direct, Node: c.NodeName, Probe: mounts.ProbeShare,
		Recorder: mgr.GetEventRecorderFor("berth-agent"), Log: c.Log.WithName("sharemount")}).SetupWithManager(mgr, sharedVolumes); err != nil {
		return err
	}
	if err := (&controller.ShareDeviceReconciler{Client: direct, Node: c.NodeName,
		Grow:     a.GrowShareDevice,
		Recorder: mgr.GetEventRecorderFor("berth-agent"), Log: c.Log.WithName("sharedevice")}).SetupWithManager(mgr, sharedVolumes); err != nil {
		return err
	}
	locks := a.Locks()
	if err := mgr.Add(fence.NewCleaner(direct, c.NodeName, a, clock.RealClock{}, c.Log.WithName("stale"),
		fence.CleanerOptions{Interval: c.StaleInterval, Lock: locks.LockContext, LockWait: c.LockWait, Metrics: m.cleanup})); err != nil {
		return err
	}
	classes, err := kubernetes.NewForConfig(c.Rest)
	if err != nil {
		return fmt.Errorf("kubernetes clientset: %w", err)
	}
	if err := mgr.Add(&nodeagent.CapacityReporter{Client: direct, Node: c.NodeName, Namespace: c.Namespace, Free: clusterCapacity(mgr.GetClient(), images),
		Schedule: capacity.Schedule{Classes: classes, Interval: c.CapacityInterval}, Log: c.Log.WithName("capacity")}); err != nil {
		return err
	}
	if err := c.addCSI(mgr, a, m.csi); err != nil {
		return err
	}
	sock := socket.NewServer(a, c.Log.WithName("socket"))
	sock.Metrics = m.flex
	// The Flexvolume driver's state is not in readiness: a failed install
	// degrades only that path (Event, Node condition, log,
	// berth_flexvolume_driver_ready).
	flex := &flexRunnable{server: sock, socket: c.AgentSocket, pluginDir: c.VolumePluginDir, log: c.Log.WithName("flexvolume"),
		root:   func() (string, error) { return flexvolume.HostRoot("/proc") },
		events: mgr.GetEventRecorderFor("berth-agent"), node: c.NodeName, metrics: m.driver,
		condition: NodeCondition{Client: direct, Node: c.NodeName, Type: FlexvolumeCondition}.Set,
		removable: flexRemovable(direct, c.KubeletDir)}
	if err := mgr.Add(flex); err != nil {
		return err
	}
	c.Log.Info("starting agent", "node", c.NodeName, "dataDirs", images.Dirs(), "runDir", c.RunDir, "csiEndpoint", c.CSIEndpoint, "version", version.Get().Version)
	return mgr.Start(ctx)
}

// addCSI serves the CSI services and, with a kubelet dir, the kubelet
// plugin-registration socket, both as manager runnables.
func (c Config) addCSI(mgr manager.Manager, a *nodeagent.Agent, m *metrics.Ops) error {
	l, err := csi.Listen(c.CSIEndpoint)
	if err != nil {
		return err
	}
	srv := csi.NewServer(c.Log.WithName("csi"), m, csi.Services{
		Identity: csi.NewIdentity(v1.DriverName, version.Get().Version, false, nil),
		Node:     csi.NewNode(a, 0),
	})
	if err := mgr.Add(manager.RunnableFunc(func(ctx context.Context) error { return csi.Serve(ctx, srv, l) })); err != nil {
		return err
	}
	// Ready when the CSI node service answers on its socket, as kubelet
	// will call it.
	if err := mgr.AddReadyzCheck("csi", csiAnswers(socketPath(c.CSIEndpoint))); err != nil {
		return err
	}
	if c.KubeletDir == "" {
		return nil
	}
	regPath := filepath.Join(c.KubeletDir, "plugins_registry", v1.DriverName+"-reg.sock")
	rl, err := csi.Listen("unix://" + regPath)
	if err != nil {
		return err
	}
	reg := csi.NewRegistration(v1.DriverName, socketPath(c.CSIEndpoint), c.Log.WithName("registration"))
	rsrv := csi.NewRegistrationServer(reg)
	return mgr.Add(manager.RunnableFunc(func(ctx context.Context) error {
		defer func() { _ = os.Remove(regPath) }()
		return csi.Serve(ctx, rsrv, rl)
	}))
}

func envOr(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}

func socketPath(endpoint string) string {
	const prefix = "unix://"
	if len(endpoint) > len(prefix) && endpoint[:len(prefix)] == prefix {
		return endpoint[len(prefix):]
	}
	return endpoint
}

// Command is `berth agent`.
func Command() cli.Command {
	return kube.NewCommand("agent", "run the node agent (CSI node service, volume images, kubelet registration)", func(fs *flag.FlagSet) kube.Run {
		var cfg Config
		fs.StringVar(&cfg.NodeName, "node-name", os.Getenv("NODE_NAME"), "this node's name (default $NODE_NAME)")
		fs.StringVar(&cfg.Namespace, "namespace", envOr("POD_NAMESPACE", "berth-system"), "berth's namespace, for this node's CSIStorageCapacity objects (default $POD_NAMESPACE or berth-system)")
		fs.Var(&dataDirs{&cfg.DataDirs}, "data-dir", "a StorageCluster's data dir (its local volume images); repeat for each cluster this agent serves")
		fs.StringVar(&cfg.RunDir, "run-dir", "/run/berth", "node-wide folder for the blockdev servers' mount points and the Flexvolume staging folders (the keeper must see it)")
		fs.StringVar(&cfg.CSIEndpoint, "csi-endpoint", "unix:///var/lib/kubelet/plugins/berth.io/csi.sock", "CSI endpoint (unix socket)")
		fs.StringVar(&cfg.KubeletDir, "kubelet-dir", "/var/lib/kubelet", "kubelet root: plugin registration, and the only folder (with the run dir's flex-staging) whose volume paths the agent mounts or unmounts; empty: do not register, accept no kubelet path")
		fs.StringVar(&cfg.AgentSocket, "agent-socket", flexvolume.DefaultSocket, "root-only agent socket for the Flexvolume driver")
		fs.StringVar(&cfg.VolumePluginDir, "volume-plugin-dir", "/usr/libexec/kubernetes/kubelet-plugins/volume/exec", "kubelet's Flexvolume folder to install the driver into; empty: do not install")
		fs.StringVar(&cfg.HealthAddr, "health-addr", DefaultHealthAddr, "/healthz and /readyz listen address (the agent runs on the host network); 0 disables")
		fs.DurationVar(&cfg.CapacityInterval, "capacity-interval", 30*time.Second, "how often free capacity is reported")
		fs.DurationVar(&cfg.StaleInterval, "stale-interval", 5*time.Minute, "how often this node's stale-attachment list is processed (also at start)")
		fs.StringVar(&cfg.HolderNetnsDir, "holder-netns-dir", network.NetnsDir, "holder records of StorageClusters in the multus netns mode, one folder per cluster: storage traffic runs in the namespace of the holder found there")
		fs.StringVar(&cfg.KeeperSocket, "keeper-socket", "/run/berth/keeper.sock", "socket of the berth keeper (userspace volumes)")
		fs.StringVar(&cfg.BlockdevBinary, "blockdev-binary", "", "berth binary that runs blockdev servers (default: this executable); the servers of file images run its static build berth-blockdev beside it when there is one")
		fs.BoolVar(&cfg.BlockdevPassthrough, "blockdev-passthrough", true, "let the kernel do data I/O of userspace volumes (FUSE passthrough, kernel 6.9+; ignored where the kernel lacks it)")
		fs.IntVar(&cfg.BlockdevWorkers, "blockdev-workers", 0, "request workers per blockdev server (0: the server's default)")
		fs.StringVar(&cfg.UserspaceTransport, "userspace-transport", "auto", "how newly staged userspace volumes of a StorageCluster that names none reach the kernel: auto (ublk where the kernel has it with user recovery, else fuse), fuse (keeper + loop), nbd (needs the nbd module) or ublk (needs ublk with user recovery)")
		fs.DurationVar(&cfg.NBDDeadConnTimeout, "nbd-dead-conn-timeout", nbd.DefaultDeadConnTimeout, "how long the kernel keeps an nbd device and queues its I/O while no server is connected")
		fs.DurationVar(&cfg.HealInterval, "heal-interval", 30*time.Second, "how often staged userspace volumes are checked and healed after the check at start; 0: only at start")
		def := mount.DefaultTimeouts()
		fs.DurationVar(&cfg.ToolTimeouts.Probe, "probe-timeout", def.Probe, "how long blkid may take before it is killed and the operation fails")
		fs.DurationVar(&cfg.ToolTimeouts.Format, "format-timeout", def.Format, "how long mkfs may take before it is killed and the stage fails")
		fs.DurationVar(&cfg.ToolTimeouts.Check, "fsck-timeout", def.Check, "how long fsck may take before it is killed and the stage fails")
		fs.DurationVar(&cfg.ToolTimeouts.Resize, "resize-timeout", def.Resize, "how long a filesystem resize may take before it is killed")
		fs.DurationVar(&cfg.ToolTimeouts.Loop, "losetup-timeout", def.Loop, "how long losetup may take before it is killed")
		fs.DurationVar(&cfg.ToolTimeouts.Mount, "mount-timeout", def.Mount, "how long mount or umount may take before it is killed")
		fs.DurationVar(&cfg.LockWait, "background-lock-wait", nodeagent.DefaultLockWait, "how long the stale-entry cleanup waits for a volume another operation holds before it retries it later (the healer never waits: it retries a busy volume after its busy retry)")
		fs.StringVar(&cfg.MetricsAddr, "metrics-addr", DefaultMetricsAddr, "Prometheus /metrics listen address (the agent runs on the host network); 0 disables")
		fs.BoolVar(&cfg.MetricsSecure, "metrics-secure", false, "serve /metrics over HTTPS to readers the API server authenticates and allows get on /metrics")
		return func(ctx context.Context, log logr.Logger, rest *rest.Config) error {
			cfg.Log, cfg.Rest = log, rest
			return cfg.Run(ctx)
		}
	})
}

// userspace is the agent's userspace mounter: blockdev servers of this
// executable (or --blockdev-binary), the keeper, and nbd and ublk where the
// kernel has them.
func (c Config) userspace() (*nodeagent.UserspaceConfig, error) {
	bin := c.BlockdevBinary
	if bin == "" {
		self, err := os.Executable()
		if err != nil {
			return nil, fmt.Errorf("blockdev binary: %w", err)
		}
		bin = self
	}
	transport, err := nodeagent.ParseTransport(c.UserspaceTransport)
	if err != nil {
		return nil, err
	}
	nbdDevs := nbd.NewDevices(nbd.NewNetlink(), "/sys", c.NodeName)
	if ok, reason := nbdDevs.Available(); transport == nodeagent.TransportNBD && !ok {
		// Still start: volumes staged over FUSE before keep working, and
		// staging a new one says why it cannot.
		c.Log.Error(nodeagent.ErrNBDUnavailable, "userspace transport nbd set, but this node cannot serve it", "reason", reason)
	}
	ublkDevs := ublk.NewDevices(ublk.ControlConfig{})
	switch err := ublkDevs.Probe(); {
	case transport == nodeagent.TransportUblk && err != nil:
		c.Log.Error(err, "userspace transport ublk set, but this node cannot serve it")
	case err != nil:
		c.Log.Info("userspace transport auto stages over fuse on this node: it cannot serve ublk", "reason", err.Error())
	default:
		c.Log.Info("userspace transport auto stages over ublk on this node")
	}
	return &nodeagent.UserspaceConfig{
		Root: filepath.Join(c.RunDir, userspaceDir), Binary: bin, SlimBinary: launch.SlimBinary(bin),
		CephBinary: launch.CephBinary(bin), KeeperSocket: c.KeeperSocket,
		Keeper: keeper.NewClient(c.KeeperSocket), Start: nodeagent.StartServer, StopPID: launch.StopPID,
		CheckMount: blockdev.CheckMount, Workers: c.BlockdevWorkers, Passthrough: c.BlockdevPassthrough,
		Transport: transport, NBD: nbdDevs, Ublk: ublkDevs, DeadConnTimeout: c.NBDDeadConnTimeout,
	}, nil
}
