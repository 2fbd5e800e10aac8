// Package operator is the `berth operator` command: a controller-runtime
// manager that turns StorageClusters into running storage.
package operator

import (
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/berth-io/berth/internal/fence"

	"github.com/go-logr/logr"
	appsv1 "k8s.io/api/apps/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/client-go/rest"
	toolscache "k8s.io/client-go/tools/cache"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/healthz"

	v1 "github.com/berth-io/berth/api/v1alpha1"
	"github.com/berth-io/berth/internal/cli"
	"github.com/berth-io/berth/internal/cli/kube"
	"github.com/berth-io/berth/internal/controller/pinned"
	"github.com/berth-io/berth/internal/controller/sharemanager"
	"github.com/berth-io/berth/internal/controller/storagecluster"
	"github.com/berth-io/berth/internal/controller/takeover"
	berthmetrics "github.com/berth-io/berth/internal/metrics"
	"github.com/berth-io/berth/internal/scheme"
	"github.com/berth-io/berth/internal/version"
)

// leaderElectionID names the Lease the operator replicas compete for.
const leaderElectionID = "berth-operator.berth.io"

// Leader election and the events it records.
// +kubebuilder:rbac:groups=coordination.k8s.io,namespace=berth-system,resources=leases,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups="",namespace=berth-system,resources=events,verbs=create;patch
// +kubebuilder:rbac:groups=events.k8s.io,namespace=berth-system,resources=events,verbs=create;patch

// The operator's endpoints (controller-runtime's usual ports).
const (
	DefaultMetricsAddr = ":8080"
	DefaultHealthAddr  = ":8081"
)

// Config of the operator.
type Config struct {
	// UnfenceCooldown: how long a node whose Ceph clients were blocklisted
	// must stay back and cleaned before they are taken off the blocklist.
	UnfenceCooldown time.Duration
	// UnfenceInterval: how often the Unfencer looks for nodes to unfence.
	UnfenceInterval time.Duration

	Cluster     storagecluster.Options
	LeaderElect bool
	MetricsAddr string
	HealthAddr  string
	// StaleListTTL: how long the GC keeps the stale list of a deleted node.
	StaleListTTL time.Duration
	// ShareManagerServiceAccount runs the share-manager pods of RWX volumes.
	ShareManagerServiceAccount string
	Rest                       *rest.Config
	Log                        logr.Logger
}

// A secure metrics endpoint (--metrics-secure) asks the API server who
// each reader is and whether it may get /metrics.
// +kubebuilder:rbac:groups=authentication.k8s.io,resources=tokenreviews,verbs=create
// +kubebuilder:rbac:groups=authorization.k8s.io,resources=subjectaccessreviews,verbs=create

// Run runs the manager until ctx ends.
func (c Config) Run(ctx context.Context) error {
	if err := c.Cluster.Validate(); err != nil {
		return err
	}
	s, err := scheme.New()
	if err != nil {
		return err
	}
	// The owned workloads live in one namespace: cache only that one.
	ns := map[string]cache.Config{c.Cluster.Namespace: {}}
	mgr, err := ctrl.NewManager(c.Rest, ctrl.Options{
		Scheme:                        s,
		Logger:                        c.Log,
		Metrics:                       berthmetrics.ServerOptions(c.MetricsAddr, c.Cluster.MetricsSecure),
		HealthProbeBindAddress:        c.HealthAddr,
		LeaderElection:                c.LeaderElect,
		LeaderElectionID:              leaderElectionID,
		LeaderElectionNamespace:       c.Cluster.Namespace,
		LeaderElectionReleaseOnCancel: true,
		Cache: cache.Options{ByObject: map[client.Object]cache.ByObject{
			&appsv1.DaemonSet{}:  {Namespaces: ns},
			&appsv1.Deployment{}: {Namespaces: ns},
			// The CSI controller's PodDisruptionBudget.
			&policyv1.PodDisruptionBudget{}: {Namespaces: ns},
			&corev1.Service{}:               {Namespaces: ns},
			// Share-manager pods and their Leases live there too.
			&corev1.Pod{}:           {Namespaces: ns},
			&coordinationv1.Lease{}: {Namespaces: ns},
			&v1.ShareManager{}:      {Namespaces: ns},
		}},
	})
	if err != nil {
		return fmt.Errorf("manager: %w", err)
	}
	if c.HealthAddr != "" && c.HealthAddr != "0" {
		if err := mgr.AddHealthzCheck("ping", healthz.Ping); err != nil {
			return err
		}
		if err := mgr.AddReadyzCheck("ping", healthz.Ping); err != nil {
			return err
		}
	}
	// Moving entries off Attachments decides on fresh reads, not the cache.
	direct, err := client.New(c.Rest, client.Options{Scheme: mgr.GetScheme()})
	if err != nil {
		return fmt.Errorf("kubernetes client: %w", err)
	}
	// The operator reaches each ceph cluster as its Secret's client to
	// fence (a deletion that stops waiting) and unfence (the Unfencer).
	bl := &fence.CephClusters{C: direct, Namespace: c.Cluster.Namespace, Log: c.Log.WithName("fencing")}
	r := &storagecluster.Reconciler{Client: mgr.GetClient(), Options: c.Cluster, Log: c.Log.WithName("storagecluster"),
		Direct: direct, Recorder: mgr.GetEventRecorderFor("berth-operator"), Blocklister: bl}
	if err := r.SetupWithManager(mgr); err != nil {
		return err
	}
	holders := &storagecluster.HolderEvents{Client: mgr.GetClient(), Recorder: mgr.GetEventRecorderFor("berth-operator"),
		Namespace: c.Cluster.Namespace, Log: c.Log.WithName("holder-events")}
	if err := holders.SetupWithManager(mgr); err != nil {
		return err
	}
	if err := c.addAttachmentGC(ctx, mgr, bl); err != nil {
		return err
	}
	// Lock breaks now happen here (take-over requests): the operator
	// exports the fence metrics' lock_breaks_total.
	fenceMetrics, err := berthmetrics.NewFence(metrics.Registry)
	if err != nil && !berthmetrics.IsAlreadyRegistered(err) {
		return err
	}
	if err := berthmetrics.NewBuildInfo(metrics.Registry, version.Get()); err != nil && !berthmetrics.IsAlreadyRegistered(err) {
		return err
	}
	breaker := &takeover.Reconciler{
		Fencer: fence.New(direct, mgr.GetEventRecorderFor("berth-operator"), clock.RealClock{}, c.Log.WithName("take-over"),
			fence.Options{Metrics: fenceMetrics}),
		BlocklisterFor: bl.For, Log: c.Log.WithName("take-over"),
	}
	if err := breaker.SetupWithManager(mgr); err != nil {
		return err
	}
	reporter := &pinned.Reporter{
		Client: mgr.GetClient(), Reader: mgr.GetAPIReader(),
		Recorder: mgr.GetEventRecorderFor("berth-operator"), Log: c.Log.WithName("pinned-volumes"),
	}
	if err := reporter.SetupWithManager(mgr); err != nil {
		return err
	}
	if err := c.addShareManagers(mgr); err != nil {
		return err
	}
	c.Log.Info("starting operator", "namespace", c.Cluster.Namespace, "image", c.Cluster.Image,
		"leaderElection", c.LeaderElect, "version", version.Get().Version)
	return mgr.Start(ctx)
}

// Flags binds the operator's flags to a Config; env supplies defaults
// (POD_NAMESPACE).
func Flags(fs *flag.FlagSet, cfg *Config, env func(string) string) {
	o := &cfg.Cluster
	ns := env("POD_NAMESPACE")
	if ns == "" {
		ns = "berth-system"
	}
	fs.StringVar(&o.Namespace, "namespace", ns, "namespace of the owned workloads (default $POD_NAMESPACE or berth-system)")
	fs.StringVar(&o.Image, "image", "berth.local/berth:dev", "berth image every component runs")
	fs.Func("image-pull-policy", "pull policy of every container (Always, IfNotPresent, Never; default: Kubernetes')", func(s string) error {
		switch p := corev1.PullPolicy(s); p {
		case corev1.PullAlways, corev1.PullIfNotPresent, corev1.PullNever:
			o.ImagePullPolicy = p
			return nil
		}
		return errors.New("want Always, IfNotPresent or Never")
	})
	fs.Func("image-pull-secrets", "comma-separated Secrets in --namespace that every pod berth makes pulls its images with", func(s string) error {
		o.ImagePullSecrets = nil
		for _, name := range strings.Split(s, ",") {
			if name = strings.TrimSpace(name); name != "" {
				o.ImagePullSecrets = append(o.ImagePullSecrets, corev1.LocalObjectReference{Name: name})
			}
		}
		return nil
	})
	fs.StringVar(&o.ProvisionerImage, "provisioner-image", "berth.local/csi-provisioner:v5.3.0", "external-provisioner sidecar image")
	fs.StringVar(&o.ResizerImage, "resizer-image", "berth.local/csi-resizer:v1.14.0", "external-resizer sidecar image")
	fs.StringVar(&o.SnapshotterImage, "snapshotter-image", "berth.local/csi-snapshotter:v8.3.0", "external-snapshotter sidecar image")
	fs.StringVar(&o.KubeletDir, "kubelet-dir", "/var/lib/kubelet", "kubelet root folder on the nodes")
	fs.StringVar(&o.VolumePluginDir, "volume-plugin-dir", "/usr/libexec/kubernetes/kubelet-plugins/volume/exec", "kubelet's Flexvolume plugin folder on the nodes; empty: Flexvolume off on every node")
	fs.StringVar(&o.AgentServiceAccount, "agent-service-account", "berth-agent", "service account of the agent DaemonSet")
	fs.StringVar(&o.ControllerServiceAccount, "controller-service-account", "berth-csi-controller", "service account of the CSI controller Deployment")
	fs.StringVar(&o.APIServerHost, "api-server-host", "", "KUBERNETES_SERVICE_HOST for berth's pods (empty: leave as is)")
	fs.StringVar(&o.APIServerPort, "api-server-port", "", "KUBERNETES_SERVICE_PORT for berth's pods (empty: leave as is)")
	fs.BoolVar(&o.DefaultStorageClass, "default-storage-class", false, "mark the berth class as the cluster's default")
	fs.BoolVar(&cfg.LeaderElect, "leader-elect", true, "elect a leader among operator replicas (a Lease in --namespace)")
	fs.StringVar(&cfg.MetricsAddr, "metrics-addr", DefaultMetricsAddr, "Prometheus /metrics listen address; 0 disables")
	fs.BoolVar(&o.MetricsSecure, "metrics-secure", false, "serve /metrics over HTTPS to readers the API server authenticates and allows get on /metrics, and render the agent and CSI controller so")
	fs.StringVar(&cfg.HealthAddr, "health-addr", DefaultHealthAddr, "/healthz and /readyz listen address; 0 disables")
	fs.StringVar(&cfg.ShareManagerServiceAccount, "share-manager-service-account", "berth-share-manager", "service account of the share-manager pods of RWX volumes")
	fs.DurationVar(&cfg.StaleListTTL, "stale-list-ttl", fence.DefaultStaleListTTL, "how long the attachment GC keeps the stale list (NodeCleanup) of a node whose Node object is gone")
	fs.DurationVar(&cfg.UnfenceCooldown, "unfence-cooldown", fence.DefaultUnfenceCooldown, "how long a node whose Ceph clients lock breaking blocklisted must stay back and cleaned before they leave the blocklist")
	fs.DurationVar(&cfg.UnfenceInterval, "unfence-interval", fence.DefaultUnfenceInterval, "how often the operator looks for nodes whose Ceph clients may leave the blocklist")
}

// Command is `berth operator`.
func Command() cli.Command {
	return kube.NewCommand("operator", "reconcile StorageClusters into agents, keepers, the CSI controller and classes", func(fs *flag.FlagSet) kube.Run {
		var cfg Config
		Flags(fs, &cfg, os.Getenv)
		return func(ctx context.Context, log logr.Logger, rest *rest.Config) error {
			cfg.Log, cfg.Rest = log, rest
			return cfg.Run(ctx)
		}
	})
}

// The attachment GC scans every Attachment each
// StorageCluster.spec.attachmentGC.interval and moves or drops entries whose
// node or pod is gone; the Unfencer takes blocklisted Ceph clients of nodes
// that are back and cleaned off the blocklist.
// +kubebuilder:rbac:groups=berth.io,resources=attachments,verbs=get;list;watch;update;patch;delete
// +kubebuilder:rbac:groups=berth.io,resources=nodecleanups,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups=berth.io,resources=storageclusters,verbs=get;list;watch
// +kubebuilder:rbac:groups="",resources=nodes,verbs=get;list;watch
// +kubebuilder:rbac:groups="",resources=pods,verbs=get;list;watch
// The Unfencer reads each ceph StorageCluster's Secret to reach its Ceph.
// +kubebuilder:rbac:groups="",namespace=berth-system,resources=secrets,verbs=get
// +kubebuilder:rbac:groups="",resources=events,verbs=create;patch

func (c Config) addAttachmentGC(ctx context.Context, mgr ctrl.Manager, bl fence.Blocklister) error {
	// Reads go to the API server: a stale cache could move a live entry.
	direct, err := client.New(c.Rest, client.Options{Scheme: mgr.GetScheme()})
	if err != nil {
		return fmt.Errorf("kubernetes client: %w", err)
	}
	// The Unfencer takes fenced clients off the blocklist with bl. The GC
	// below has no Blocklister: a gone node's Ceph entries wait for lock
	// breaking, which the take-over controller does with bl when a node
	// asks for the volume.
	if err := mgr.Add(fence.NewUnfencer(direct, bl, mgr.GetEventRecorderFor("berth-operator"), clock.RealClock{},
		c.Log.WithName("unfence"), fence.UnfenceOptions{Cooldown: c.UnfenceCooldown, Interval: c.UnfenceInterval})); err != nil {
		return err
	}
	gc, err := fence.NewGC(direct, clock.RealClock{}, c.Log.WithName("attachment-gc"), metrics.Registry, fence.Options{StaleListTTL: c.StaleListTTL,
		Events: mgr.GetEventRecorderFor("berth-operator")})
	if err != nil {
		return err
	}
	// A StorageCluster made or changed (its attachmentGC.interval) wakes
	// the GC, which otherwise would wait out the interval it read before.
	inf, err := mgr.GetCache().GetInformer(ctx, &v1.StorageCluster{})
	if err != nil {
		return fmt.Errorf("storagecluster informer: %w", err)
	}
	if _, err := inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { gc.Wake() },
		UpdateFunc: func(any, any) { gc.Wake() },
		DeleteFunc: func(any) { gc.Wake() },
	}); err != nil {
		return fmt.Errorf("watch storageclusters for the attachment GC: %w", err)
	}
	// A node declared lost (tainted out-of-service) or deleted starts a
	// burst of passes, which move its gone pods' holds within minutes,
	// not at the next interval.
	nodes, err := mgr.GetCache().GetInformer(ctx, &corev1.Node{})
	if err != nil {
		return fmt.Errorf("node informer: %w", err)
	}
	if _, err := nodes.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		UpdateFunc: func(oldObj, newObj any) {
			o, ok1 := oldObj.(*corev1.Node)
			n, ok2 := newObj.(*corev1.Node)
			if ok1 && ok2 && !fence.OutOfService(o) && fence.OutOfService(n) {
				c.Log.Info("node tainted out-of-service: attachment GC passes over the next minutes", "node", n.Name)
				gc.NodeLost()
			}
		},
		DeleteFunc: func(any) { gc.NodeLost() },
	}); err != nil {
		return fmt.Errorf("watch nodes for the attachment GC: %w", err)
	}
	return mgr.Add(gc)
}

// addShareManagers registers the controllers of RWX volumes: a
// ShareManager per volume, and its pod and Service.
func (c Config) addShareManagers(mgr ctrl.Manager) error {
	o := sharemanager.Options{
		Namespace: c.Cluster.Namespace, Image: c.Cluster.Image, ImagePullPolicy: c.Cluster.ImagePullPolicy,
		ImagePullSecrets: c.Cluster.ImagePullSecrets, ServiceAccount: c.ShareManagerServiceAccount,
		APIServerHost: c.Cluster.APIServerHost, APIServerPort: c.Cluster.APIServerPort,
	}
	v := &sharemanager.VolumeReconciler{Client: mgr.GetClient(), Options: o, Log: c.Log.WithName("volume-share")}
	if err := v.SetupWithManager(mgr); err != nil {
		return err
	}
	shares, err := berthmetrics.NewShare(metrics.Registry, sharemanager.FailoverReasons...)
	if err != nil && !berthmetrics.IsAlreadyRegistered(err) {
		return err
	}
	_, err = berthmetrics.NewShareStates(metrics.Registry, sharemanager.StateCounts{Reader: mgr.GetClient(), Namespace: c.Cluster.Namespace},
		c.Log.WithName("metrics"), sharemanager.States...)
	if err != nil && !berthmetrics.IsAlreadyRegistered(err) {
		return err
	}
	r := &sharemanager.Reconciler{Client: mgr.GetClient(), Reader: mgr.GetAPIReader(), Options: o, Clock: clock.RealClock{},
		Recorder: mgr.GetEventRecorderFor("berth-operator"), Metrics: shares, Log: c.Log.WithName("sharemanager")}
	return r.SetupWithManager(mgr)
}
