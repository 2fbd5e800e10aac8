// Package sanity runs csi-test's sanity suite against the real berth driver:
// `berth agent` and `berth csi-controller` (their Run functions, in this
// process) on a real kube-apiserver + etcd, with real loop devices, mkfs and
// mounts; once with mount and once with block access.
package sanity

import (
	"context"
	"fmt"
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
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/berth-io/berth/internal/cli"
	agentcli "github.com/berth-io/berth/internal/cli/agent"
	"github.com/berth-io/berth/internal/cli/csicontroller"
	"github.com/berth-io/berth/internal/testenv"
)

const nodeName = "sanity-node"

var (
	work     string // data dir, sockets, targets
	mountCfg = sanity.NewTestConfig()
	blockCfg = sanity.NewTestConfig()
	counts   = map[types.SpecState]int{}
)

func TestSanity(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("csi-sanity needs root: it makes loop devices, filesystems and mounts")
	}
	if _, err := os.Stat("/dev/loop-control"); err != nil {
		t.Skip("csi-sanity needs loop devices: /dev/loop-control is missing")
	}
	env, err := testenv.Start()
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := env.Stop(); err != nil {
			t.Errorf("stop envtest: %v", err)
		}
	}()
	work = t.TempDir()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodeName}}
	if err := env.Client.Create(ctx, node); err != nil {
		t.Fatal(err)
	}
	log := cli.NewLogger(GinkgoWriter, 0, "sanity")
	nodeSock := filepath.Join(work, "node.sock")
	ctrlSock := filepath.Join(work, "controller.sock")
	dataDir := filepath.Join(work, "data")
	done := make(chan error, 2)
	go func() {
		done <- agentcli.Config{
			NodeName: nodeName, DataDir: dataDir, CSIEndpoint: "unix://" + nodeSock,
			CapacityInterval: time.Second, MetricsAddr: "0", Rest: env.Config, Log: log.WithName("agent"),
		}.Run(ctx)
	}()
	go func() {
		done <- csicontroller.Config{
			Endpoint: "unix://" + ctrlSock, StorageCluster: "sanity", Wait: 30 * time.Second,
			Rest: env.Config, Log: log.WithName("controller"),
		}.Run(ctx)
	}()
	waitForSockets(t, nodeSock, ctrlSock)

	configure(&mountCfg, "mount", nodeSock, ctrlSock)
	configure(&blockCfg, "block", nodeSock, ctrlSock)

	RegisterFailHandler(Fail)
	suite, reporter := GinkgoConfiguration()
	reporter.Succinct = true
	RunSpecs(t, "berth CSI sanity", suite, reporter)

	fmt.Printf("sanity: %d passed, %d failed, %d skipped\n",
		counts[types.SpecStatePassed], counts[types.SpecStateFailed]+counts[types.SpecStatePanicked]+counts[types.SpecStateTimedout], counts[types.SpecStateSkipped]+counts[types.SpecStatePending])

	cancel()
	for range 2 {
		if err := <-done; err != nil {
			t.Errorf("driver: %v", err)
		}
	}
	checkNothingLeft(t, dataDir)
}

func configure(c *sanity.TestConfig, access, nodeSock, ctrlSock string) {
	base := filepath.Join(work, access)
	c.Address = "unix://" + nodeSock
	c.ControllerAddress = "unix://" + ctrlSock
	c.TargetPath = filepath.Join(base, "target")
	c.StagingPath = filepath.Join(base, "staging")
	c.TestVolumeAccessType = access
	c.TestVolumeSize = 64 << 20
	c.TestVolumeExpandSize = 128 << 20
	c.IdempotentCount = 2
	// Each spec gets fresh target and staging folders, as kubelet would give.
	c.CreateTargetDir = func(p string) (string, error) { return p, os.MkdirAll(p, 0o750) }
	c.CreateStagingDir = c.CreateTargetDir
}

var _ = Describe("berth", func() {
	Context("mount access", func() { sanity.GinkgoTest(&mountCfg) })
	Context("block access", func() { sanity.GinkgoTest(&blockCfg) })
})

var _ = ReportAfterEach(func(r SpecReport) { counts[r.State]++ })

func waitForSockets(t *testing.T, paths ...string) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for _, p := range paths {
		for {
			if _, err := os.Stat(p); err == nil {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("socket %s did not appear", p)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
}

// checkNothingLeft proves the suite left no loop device, mount or image.
func checkNothingLeft(t *testing.T, dataDir string) {
	t.Helper()
	out, err := exec.Command("losetup", "-a").CombinedOutput()
	if err != nil {
		t.Errorf("losetup -a: %v", err)
	}
	for _, l := range strings.Split(string(out), "\n") {
		if strings.Contains(l, work) {
			t.Errorf("loop device left behind: %s", l)
		}
	}
	mi, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(mi), "\n") {
		if strings.Contains(l, work) {
			t.Errorf("mount left behind: %s", l)
		}
	}
	var images []string
	_ = filepath.Walk(dataDir, func(p string, info os.FileInfo, err error) error {
		if err == nil && info.Mode().IsRegular() {
			images = append(images, p)
		}
		return nil
	})
	if len(images) > 0 {
		t.Errorf("image files left behind: %v", images)
	}
	if !t.Failed() {
		fmt.Println("sanity: nothing left behind (no loop device, mount or image file)")
	}
}
