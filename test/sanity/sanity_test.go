// Package sanity runs csi-test's sanity suite against the real berth driver:
// `berth agent` and `berth csi-controller` (their Run functions, in this
// process) on a real kube-apiserver + etcd, with real loop devices, mkfs and
// mounts; once with mount and once with block access.
package sanity

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kubernetes-csi/csi-test/v5/pkg/sanity"
	. "github.com/onsi/ginkgo/v2"
	"github.com/onsi/ginkgo/v2/types"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/berth-io/berth/api/v1alpha1"
	"github.com/berth-io/berth/internal/blockdev/ublk"
	agentcli "github.com/berth-io/berth/internal/cli/agent"
	"github.com/berth-io/berth/internal/cli/csicontroller"
	"github.com/berth-io/berth/internal/cli/kube"
	berthcsi "github.com/berth-io/berth/internal/csi"
	"github.com/berth-io/berth/internal/testenv"
)

const (
	suiteName      = "berth CSI sanity"
	nodeName       = "sanity-node"
	berthNamespace = "berth-system"
)

// sanityCluster is the StorageCluster of the sanity volumes.
const sanityCluster = "sanity"

// cephSpecs matches every spec of the ceph class: a ginkgo skip pattern,
// matched against the suite's description and the spec's full text.
const cephSpecs = `^berth CSI sanity berth ceph (mount|block) access `

// classParams are the parameters of the volumes the tests create.
func classParams() map[string]string {
	p := map[string]string{v1.ParamStorageCluster: sanityCluster}
	if userspaceTransport() != "" {
		p[berthcsi.ParamMounter] = string(v1.MounterUserspace)
	}
	return p
}

// userspaceTransport is BERTH_SANITY_TRANSPORT (fuse, nbd or ublk). When
// it is set, the local class's volumes are userspace ones, and both
// StorageClusters serve userspace volumes over it. Unset, the local class
// is a kernel one and the ceph class's volumes go over fuse.
func userspaceTransport() v1.UserspaceTransport {
	return v1.UserspaceTransport(os.Getenv("BERTH_SANITY_TRANSPORT"))
}

var (
	work     string // data dir, sockets, targets
	mountCfg = sanity.NewTestConfig()
	blockCfg = sanity.NewTestConfig()
	// The same suites on a class of a ceph StorageCluster (ceph_test.go).
	cephMountCfg = sanity.NewTestConfig()
	cephBlockCfg = sanity.NewTestConfig()
	counts       = map[types.SpecState]int{}
)

// driver is the berth driver under test, shared by every test here.
type driver struct {
	env      *testenv.Env
	dataDir  string
	nodeSock string
	ctrlSock string
	// The agent's and the controller's metrics and health endpoints.
	agentMetrics, agentHealth, ctrlMetrics, ctrlHealth string
	cancel                                             context.CancelFunc
	done                                               chan error
	// The keeper and blockdev binary of userspace volumes.
	userspace *userspace
}

var (
	drv   driver
	suite = &testenv.Suite{Devices: []string{"/dev/loop-control"}, Setup: drv.start, Teardown: drv.teardown}
)

func TestMain(m *testing.M) { os.Exit(testenv.Main(m, suite)) }

// teardown stops the driver and checks that it left nothing behind.
func (d *driver) teardown(bool) error {
	err := d.stop()
	if d.dataDir != "" {
		if left := nothingLeft(d.dataDir); left != nil {
			err = errors.Join(err, left)
		} else {
			fmt.Println("sanity: nothing left behind (no loop device, mount or image file)")
		}
	}
	if work != "" {
		_ = os.RemoveAll(work)
	}
	return err
}

func (d *driver) start(env *testenv.Env) error {
	d.env = env
	var err error
	if work, err = os.MkdirTemp("", "berth-sanity-"); err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(context.Background())
	d.cancel = cancel
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodeName}}
	if err := d.env.Client.Create(ctx, node); err != nil {
		return err
	}
	// The agent publishes its free space per berth class in berth's
	// namespace (CSIStorageCapacity), where the controller places volumes by it.
	for _, obj := range []client.Object{
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: berthNamespace}},
		&storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: "berth"}, Provisioner: v1.DriverName, Parameters: classParams()},
		// The class's cluster: the CSI controller makes volumes only for one
		// that exists.
		&v1.StorageCluster{ObjectMeta: metav1.ObjectMeta{Name: sanityCluster}, Spec: v1.StorageClusterSpec{DataDir: filepath.Join(work, "data"),
			Agent: v1.AgentSpec{UserspaceTransport: userspaceTransport()}}},
	} {
		if err := d.env.Client.Create(ctx, obj); err != nil {
			return err
		}
	}
	log := kube.NewLogger(GinkgoWriter, 0, "sanity")
	d.nodeSock = filepath.Join(work, "node.sock")
	d.ctrlSock = filepath.Join(work, "controller.sock")
	d.dataDir = filepath.Join(work, "data") // the StorageCluster's too
	d.done = make(chan error, 2)
	if d.userspace, err = startUserspace(work); err != nil {
		return err
	}
	for _, addr := range []*string{&d.agentMetrics, &d.agentHealth, &d.ctrlMetrics, &d.ctrlHealth} {
		if *addr, err = testenv.FreeAddr(); err != nil {
			return err
		}
	}
	go func() {
		d.done <- agentcli.Config{
			NodeName: nodeName, Namespace: berthNamespace, DataDirs: []string{d.dataDir}, RunDir: filepath.Join(work, "run"), CSIEndpoint: "unix://" + d.nodeSock, KubeletDir: kubeletRoot(),
			AgentSocket: filepath.Join(work, "run", "agent.sock"), KeeperSocket: d.userspace.socket, BlockdevBinary: d.userspace.berth,
			CapacityInterval: time.Second, MetricsAddr: d.agentMetrics, HealthAddr: d.agentHealth, Rest: d.env.Config, Log: log.WithName("agent"),
		}.Run(ctx)
	}()
	go func() {
		d.done <- csicontroller.Config{
			Endpoint: "unix://" + d.ctrlSock, Namespace: berthNamespace, Wait: 30 * time.Second,
			MetricsAddr: d.ctrlMetrics, HealthAddr: d.ctrlHealth, Rest: d.env.Config, Log: log.WithName("controller"),
		}.Run(ctx)
	}()
	return waitForSockets(d.nodeSock, d.ctrlSock)
}

func (d *driver) stop() error {
	var errs []error
	if d.cancel != nil {
		d.cancel()
		for range cap(d.done) {
			select {
			case err := <-d.done:
				errs = append(errs, err)
			case <-time.After(30 * time.Second):
				errs = append(errs, fmt.Errorf("driver did not stop within 30s"))
			}
		}
	}
	// After the agent: it may still have unstaged volumes.
	d.userspace.stop()
	return errors.Join(errs...)
}

func skipUnlessDriver(t *testing.T) {
	t.Helper()
	suite.Require(t)
}

func TestSanity(t *testing.T) {
	skipUnlessDriver(t)
	configure(t, &mountCfg, "mount", "mount", classParams())
	configure(t, &blockCfg, "block", "block", classParams())
	// The ceph class's specs that cannot run here are skipped, each with
	// the reason printed (never a silent pass).
	cephSkips := cephSanity(t, func(params map[string]string, secretsFile string) {
		configure(t, &cephMountCfg, "ceph-mount", "mount", params)
		configure(t, &cephBlockCfg, "ceph-block", "block", params)
		cephMountCfg.SecretsFile, cephBlockCfg.SecretsFile = secretsFile, secretsFile
	})

	RegisterFailHandler(Fail)
	suite, reporter := GinkgoConfiguration()
	suite.SkipStrings = append(suite.SkipStrings, cephSkips...)
	suite.SkipStrings = append(suite.SkipStrings, transportSkips()...)
	reporter.Succinct = true
	RunSpecs(t, suiteName, suite, reporter)

	fmt.Printf("\nsanity: %d passed, %d failed, %d skipped\n",
		counts[types.SpecStatePassed], counts[types.SpecStateFailed]+counts[types.SpecStatePanicked]+counts[types.SpecStateTimedout], counts[types.SpecStateSkipped]+counts[types.SpecStatePending])
}

// transportSkips are the specs the userspace transport cannot pass on this
// kernel, each printed with its reason (never a silent pass). nbd fixes a
// device's size at connect (the kernel's netlink interface has no
// resize), and ublk before Linux 6.16 has no UPDATE_SIZE: berth refuses
// to grow such a staged volume and grows it at its next stage instead
// (docs/operations.md, Expansion), so node expansion after publish is
// skipped.
func transportSkips() []string {
	const expandAfterPublish = `NodeExpandVolume should work if node-expand is called after node-publish`
	why := ""
	switch userspaceTransport() {
	case v1.TransportNBD:
		why = "nbd fixes the size at connect"
	case v1.TransportUblk:
		why = ublkNoUpdateSize()
	}
	if why == "" {
		return nil
	}
	fmt.Printf("sanity: skipped over %s: NodeExpandVolume after publish (%s; berth grows the volume at its next stage)\n", userspaceTransport(), why)
	return []string{expandAfterPublish}
}

// ublkNoUpdateSize says why this kernel's ublk driver cannot resize a
// running device, "" when it can.
func ublkNoUpdateSize() string {
	c, err := ublk.OpenControl(ublk.ControlConfig{})
	if err != nil {
		return err.Error()
	}
	defer func() { _ = c.Close() }()
	f, err := c.Features()
	if err != nil {
		return err.Error()
	}
	if f&ublk.FlagUpdateSize == 0 {
		return ublk.ErrNoUpdateSize.Error()
	}
	return ""
}

// configure points c at the driver through the proxies named name, with
// its own target and staging folders, for access (mount or block) to
// volumes of a class with params.
func configure(t *testing.T, c *sanity.TestConfig, name, access string, params map[string]string) {
	node := drv.nodeSock + "." + name
	nodeWithControllerIdentity(t, node+".id", drv.nodeSock, drv.ctrlSock)
	slowAccept(t, node, node+".id")
	slowAccept(t, drv.ctrlSock+"."+name, drv.ctrlSock)
	c.Address = "unix://" + node
	c.ControllerAddress = "unix://" + drv.ctrlSock + "." + name
	// Where kubelet puts them: the agent refuses other paths.
	c.TargetPath = filepath.Join(kubeletRoot(), "pods", "sanity-"+name, "volumes", "kubernetes.io~csi", "pv", "target")
	c.StagingPath = filepath.Join(kubeletRoot(), "plugins", "kubernetes.io", "csi", "berth.io", name, "staging")
	c.TestVolumeAccessType = access
	c.TestVolumeParameters = params
	c.TestVolumeSize = 64 << 20
	c.TestVolumeExpandSize = 128 << 20
	c.IdempotentCount = 2
	// Each spec gets fresh target and staging folders, as kubelet would give.
	c.CreateTargetDir = func(p string) (string, error) { return p, os.MkdirAll(p, 0o750) }
	c.CreateStagingDir = c.CreateTargetDir
	// Set with CreateTargetDir, so that csi-test checks that unpublish
	// removes the target.
	c.CheckPath = pathKind
}

var _ = Describe("berth", func() {
	Context("mount access", func() { sanity.GinkgoTest(&mountCfg) })
	Context("block access", func() { sanity.GinkgoTest(&blockCfg) })
	Context("ceph mount access", func() { sanity.GinkgoTest(&cephMountCfg) })
	Context("ceph block access", func() { sanity.GinkgoTest(&cephBlockCfg) })
})

var _ = ReportAfterEach(func(r SpecReport) { counts[r.State]++ })

// pathKind tells csi-test what is at p.
func pathKind(p string) (sanity.PathKind, error) {
	fi, err := os.Stat(p)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return sanity.PathIsNotFound, nil
	case err != nil:
		return "", err
	case fi.IsDir():
		return sanity.PathIsDir, nil
	case fi.Mode().IsRegular():
		return sanity.PathIsFile, nil
	}
	return sanity.PathIsOther, nil
}

func waitForSockets(paths ...string) error {
	deadline := time.Now().Add(60 * time.Second)
	for _, p := range paths {
		for {
			if _, err := os.Stat(p); err == nil {
				break
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("socket %s did not appear", p)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	return nil
}

// nothingLeft proves the tests left no loop device, mount or image.
func nothingLeft(dataDir string) error {
	var errs []error
	out, err := exec.Command("losetup", "-a").CombinedOutput()
	if err != nil {
		errs = append(errs, fmt.Errorf("losetup -a: %w", err))
	}
	for _, l := range strings.Split(string(out), "\n") {
		if strings.Contains(l, work) {
			errs = append(errs, fmt.Errorf("loop device left behind: %s", l))
		}
	}
	mi, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return err
	}
	for _, l := range strings.Split(string(mi), "\n") {
		if strings.Contains(l, work) {
			errs = append(errs, fmt.Errorf("mount left behind: %s", l))
		}
	}
	_ = filepath.Walk(dataDir, func(p string, info os.FileInfo, err error) error {
		if err == nil && info.Mode().IsRegular() {
			errs = append(errs, fmt.Errorf("file left behind: %s", p))
		}
		return nil
	})
	return errors.Join(errs...)
}
