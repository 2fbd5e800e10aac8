package sharemanager

import (
	"context"
	"flag"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/berth-io/berth/internal/cli"
	"github.com/berth-io/berth/internal/cli/kube"
	"github.com/berth-io/berth/internal/metrics"
	"github.com/berth-io/berth/internal/share"
)

// Command is `berth share-manager`.
func Command() cli.Command {
	return cli.Command{
		Name:    "share-manager",
		Summary: "serve one RWX volume over NFS (nfs-ganesha), renewing its lease",
		Main: func(ctx context.Context, args []string, stdio cli.IO) error {
			cfg, err := parse(args, stdio)
			if err != nil {
				return err
			}
			switch {
			case cfg.readyCheck:
				return cfg.checkReady()
			case cfg.aliveCheck:
				return cfg.checkAlive()
			}
			return cfg.Run(ctx)
		},
	}
}

func parse(args []string, stdio cli.IO) (Config, error) {
	fs := flag.NewFlagSet("berth share-manager", flag.ContinueOnError)
	fs.SetOutput(stdio.Stderr)
	var cfg Config
	var minors string
	var verbosity int
	fs.StringVar(&cfg.Volume, "volume", "", "volume name; the export is /<volume>")
	fs.StringVar(&cfg.Device, "device", "", "the volume's block device")
	fs.StringVar(&cfg.MountPath, "mount-path", "/export", "where the device is mounted (and formatted first when blank)")
	fs.StringVar(&cfg.FSType, "fs-type", "ext4", "filesystem of the volume")
	fs.StringVar(&cfg.StateDir, "state-dir", "/run/berth/share", "ganesha's config, pid file, log and the ready file")
	fs.StringVar(&cfg.RecoveryDir, "recovery-dir", "", "NFSv4 client recovery records; must outlive the pod (default: "+RecoveryDirName+" on the volume)")
	fs.StringVar(&cfg.BindAddr, "bind-address", "0.0.0.0", "address ganesha listens on")
	fs.IntVar(&cfg.Port, "port", 2049, "port ganesha listens on")
	fs.DurationVar(&cfg.LeaseLifetime, "nfs-lease", share.DefaultLeaseLifetime, "NFSv4 lease lifetime (whole seconds)")
	fs.DurationVar(&cfg.GracePeriod, "nfs-grace", share.DefaultGracePeriod, "NFSv4 grace period after a restart (whole seconds)")
	fs.StringVar(&minors, "nfs-minor-versions", "1,2", "NFSv4 minor versions served (0 only for clients without sessions)")
	fs.BoolVar(&cfg.SyncWrites, "sync-writes", true, "make every write stable before answering (ganesha NFS_Commit)")
	fs.DurationVar(&cfg.DeviceTimeout, "device-timeout", 2*time.Minute, "how long to wait for --device")
	fs.DurationVar(&cfg.CheckInterval, "check-interval", 5*time.Second, "time between device and export checks")
	fs.StringVar(&cfg.ShareManager, "share-manager", "", "ShareManager (in --lease-namespace) whose spec.clients are the addresses admitted (none: only --clients)")
	fs.Func("clients", "comma-separated addresses or CIDRs admitted besides the ShareManager's (the server's own check address always is)", func(s string) error {
		for _, c := range strings.Split(s, ",") {
			if c = strings.TrimSpace(c); c != "" {
				cfg.Clients = append(cfg.Clients, c)
			}
		}
		return nil
	})
	fs.BoolVar(&cfg.RootSquash, "root-squash", false, "map clients' root (uid 0) to the anonymous user")
	fs.StringVar(&cfg.NeverFormat, "never-format", "", "never format the device; the value says why it must hold a filesystem (it had one, or it is a copy)")
	fs.StringVar(&cfg.Lease.Namespace, "lease-namespace", "", "namespace of the coordination.k8s.io Lease")
	fs.StringVar(&cfg.Lease.Name, "lease-name", "", "Lease renewed while serving (none: no lease)")
	fs.StringVar(&cfg.Lease.Holder, "lease-holder", "", "holder identity in the Lease (the pod name)")
	fs.DurationVar(&cfg.Lease.Duration, "lease-duration", 15*time.Second, "Lease duration")
	fs.StringVar(&cfg.Lease.SeenVersion, "lease-seen-version", "", "resourceVersion of the Lease that the controller had seen unchanged for --lease-seen-for before it made this pod; that time counts toward the old holder's lapse")
	fs.DurationVar(&cfg.Lease.SeenFor, "lease-seen-for", 0, "how long the controller had seen --lease-seen-version unchanged")
	fs.BoolVar(&cfg.readyCheck, "ready", false, "only tell whether the share manager of --state-dir serves (exit 0) or not: the pod's readiness probe")
	fs.BoolVar(&cfg.aliveCheck, "alive", false, "only tell whether the share manager of --state-dir still runs (exit 0: a heartbeat within --alive-within) or not: the pod's liveness probe")
	fs.DurationVar(&cfg.AliveWithin, "alive-within", DefaultAliveWithin, "how old the heartbeat may be for --alive")
	fs.StringVar(&cfg.HealthAddr, "health-addr", metrics.Disabled, "address of the probes' HTTP endpoints: /healthz (the heartbeat, as --alive) and /readyz (serving, as --ready); 0: none")
	fs.IntVar(&verbosity, "v", 0, "log verbosity")
	cfg.Kube.Register(fs)
	if err := fs.Parse(args); err != nil {
		return Config{}, err
	}
	if fs.NArg() > 0 {
		return Config{}, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	for _, s := range strings.Split(minors, ",") {
		v, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil {
			return Config{}, fmt.Errorf("--nfs-minor-versions %q: %w", minors, err)
		}
		cfg.MinorVersions = append(cfg.MinorVersions, v)
	}
	cfg.Log = kube.NewLogger(stdio.Stderr, verbosity, "share-manager")
	return cfg, nil
}
