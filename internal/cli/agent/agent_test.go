package agent

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	csispec "github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/go-logr/logr/testr"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/berth-io/berth/internal/testenv"
)

// TestFlexInstallFailureDegradesOnlyFlexvolume runs the whole agent against
// a real API server with a Flexvolume folder that cannot be made: the
// install fails (an Event on the Node, berth_flexvolume_driver_ready 0, no
// agent socket), and yet the CSI node service answers through its socket
// and /readyz is OK, since readiness is the CSI service's.
func TestFlexInstallFailureDegradesOnlyFlexvolume(t *testing.T) {
	env := suite.Require(t)
	const node = "flex-broken"
	ctx := testenv.Context(t, time.Minute)
	if err := env.Client.Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node}}); err != nil {
		t.Fatal(err)
	}
	if err := env.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "berth-system"}}); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	blocker := filepath.Join(dir, "plugins")
	if err := os.WriteFile(blocker, nil, 0o600); err != nil { // a file where the folder must go
		t.Fatal(err)
	}
	metricsAddr, err := testenv.FreeAddr()
	if err != nil {
		t.Fatal(err)
	}
	healthAddr, err := testenv.FreeAddr()
	if err != nil {
		t.Fatal(err)
	}
	csiSock, agentSock := filepath.Join(dir, "csi.sock"), filepath.Join(dir, "run", "agent.sock")
	cfg := Config{
		NodeName: node, Namespace: "berth-system", DataDirs: []string{filepath.Join(dir, "data")}, RunDir: filepath.Join(dir, "run"),
		CSIEndpoint: "unix://" + csiSock, KubeletDir: filepath.Join(dir, "kubelet"), AgentSocket: agentSock,
		VolumePluginDir: filepath.Join(blocker, "exec"), BlockdevBinary: "/bin/true", KeeperSocket: filepath.Join(dir, "keeper.sock"),
		CapacityInterval: time.Minute, MetricsAddr: metricsAddr, HealthAddr: healthAddr, Rest: env.Config, Log: testr.New(t),
	}
	testenv.Serve(t, "agent", cfg.Run)

	testenv.Eventually(t, 30*time.Second, "the Event of the failed install on the Node", func(ctx context.Context) (bool, error) {
		var evs corev1.EventList
		err := env.Client.List(ctx, &evs)
		for _, e := range evs.Items {
			if e.InvolvedObject.Kind == "Node" && e.InvolvedObject.Name == node && e.Reason == "FlexvolumeDriverFailed" {
				return true, nil
			}
		}
		return false, err
	})
	conn, err := grpc.NewClient("unix://"+csiSock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close() }()
	info, err := csispec.NewNodeClient(conn).NodeGetInfo(ctx, &csispec.NodeGetInfoRequest{})
	if err != nil || info.GetNodeId() != node {
		t.Fatalf("NodeGetInfo while the Flexvolume install fails: %+v, %v", info, err)
	}
	testenv.Eventually(t, 30*time.Second, "/readyz OK while the Flexvolume install fails", func(ctx context.Context) (bool, error) {
		return testenv.GetOK(ctx, "http://"+healthAddr+"/readyz") == nil, nil
	})
	scraped := testenv.ScrapeAddr(t, metricsAddr)
	if v, ok := scraped["berth_flexvolume_driver_ready"]; !ok || v != 0 {
		t.Errorf("berth_flexvolume_driver_ready = %v (present %v), want 0", v, ok)
	}
	if _, err := os.Stat(agentSock); !os.IsNotExist(err) {
		t.Errorf("agent socket while the driver is not installed: %v", err)
	}
}
