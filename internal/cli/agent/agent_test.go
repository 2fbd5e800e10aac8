package agent

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	csispec "github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/go-logr/logr/testr"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	nodeagent "github.com/berth-io/berth/internal/agent"
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
	testenv.Eventually(t, 30*time.Second, "the Node's condition of the failed install", func(ctx context.Context) (bool, error) {
		var n corev1.Node
		if err := env.Client.Get(ctx, client.ObjectKey{Name: node}, &n); err != nil {
			return false, err
		}
		for _, c := range n.Status.Conditions {
			if c.Type == FlexvolumeCondition {
				return c.Status == corev1.ConditionFalse && c.Reason == reasonFlexInstallFailed, nil
			}
		}
		return false, nil
	})
	scraped := testenv.ScrapeAddr(t, metricsAddr)
	if v, ok := scraped["berth_flexvolume_driver_ready"]; !ok || v != 0 {
		t.Errorf("berth_flexvolume_driver_ready = %v (present %v), want 0", v, ok)
	}
	if _, err := os.Stat(agentSock); !os.IsNotExist(err) {
		t.Errorf("agent socket while the driver is not installed: %v", err)
	}
}

// TestNodeConditionWritesOnlyItsType: the agent's condition is added,
// left alone when unchanged (no write), moved with its transition time
// on a new status, and removed, while kubelet's conditions stay.
func TestNodeConditionWritesOnlyItsType(t *testing.T) {
	env := suite.Require(t)
	ctx := testenv.Context(t, time.Minute)
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "cond-node"}}
	if err := env.Client.Create(ctx, n); err != nil {
		t.Fatal(err)
	}
	kubelet := corev1.NodeCondition{Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady",
		LastHeartbeatTime: metav1.Now(), LastTransitionTime: metav1.Now()}
	n.Status.Conditions = []corev1.NodeCondition{kubelet}
	if err := env.Client.Status().Update(ctx, n); err != nil {
		t.Fatal(err)
	}
	w := NodeCondition{Client: env.Client, Node: n.Name, Type: FlexvolumeCondition}
	read := func() (rv string, mine *corev1.NodeCondition) {
		t.Helper()
		var got corev1.Node
		if err := env.Client.Get(ctx, client.ObjectKeyFromObject(n), &got); err != nil {
			t.Fatal(err)
		}
		kept := false
		for i, c := range got.Status.Conditions {
			switch c.Type {
			case FlexvolumeCondition:
				mine = &got.Status.Conditions[i]
			case corev1.NodeReady:
				kept = c.Status == corev1.ConditionTrue && c.Reason == "KubeletReady"
			}
		}
		if !kept {
			t.Errorf("kubelet's Ready condition changed: %+v", got.Status.Conditions)
		}
		return got.ResourceVersion, mine
	}

	failed := &corev1.NodeCondition{Status: corev1.ConditionFalse, Reason: reasonFlexInstallFailed, Message: "read-only file system"}
	if err := w.Set(ctx, failed); err != nil {
		t.Fatal(err)
	}
	if _, c := read(); c == nil || c.Status != corev1.ConditionFalse || c.Reason != reasonFlexInstallFailed || c.LastTransitionTime.IsZero() {
		t.Fatalf("condition after a failure: %+v", c)
	}
	// Failing since long ago: a transition now has another time.
	since := metav1.NewTime(time.Date(2020, 1, 1, 0, 0, 0, 0, time.UTC))
	if err := env.Client.Get(ctx, client.ObjectKeyFromObject(n), n); err != nil {
		t.Fatal(err)
	}
	for i := range n.Status.Conditions {
		if n.Status.Conditions[i].Type == FlexvolumeCondition {
			n.Status.Conditions[i].LastTransitionTime = since
		}
	}
	if err := env.Client.Status().Update(ctx, n); err != nil {
		t.Fatal(err)
	}
	rv, c := read()
	if err := w.Set(ctx, failed); err != nil {
		t.Fatal(err)
	}
	if again, _ := read(); again != rv {
		t.Errorf("an unchanged condition was written again (resourceVersion %s -> %s)", rv, again)
	}
	if err := w.Set(ctx, &corev1.NodeCondition{Status: corev1.ConditionFalse, Reason: reasonFlexInitFailed, Message: "no answer"}); err != nil {
		t.Fatal(err)
	}
	if _, c = read(); c == nil || c.Reason != reasonFlexInitFailed || !c.LastTransitionTime.Equal(&since) {
		t.Errorf("condition after another failure: %+v, want the transition time %v kept", c, since)
	}
	if err := w.Set(ctx, &corev1.NodeCondition{Status: corev1.ConditionTrue, Reason: reasonFlexInstalled}); err != nil {
		t.Fatal(err)
	}
	if _, c = read(); c == nil || c.Status != corev1.ConditionTrue || c.LastTransitionTime.Equal(&since) {
		t.Errorf("condition once installed: %+v, want True with a new transition time", c)
	}
	if err := w.Set(ctx, nil); err != nil {
		t.Fatal(err)
	}
	if _, c = read(); c != nil {
		t.Errorf("condition after removal: %+v", c)
	}
	if err := w.Set(ctx, nil); err != nil {
		t.Errorf("removing a condition that is not there: %v", err)
	}
}

// TestRunRefusesNewerRecords: an agent started on a node whose records
// another release wrote in a newer format (a rollback past a format
// change) stops at once, saying which record, before it serves anything
// or touches a volume: no CSI socket, the record as it was.
func TestRunRefusesNewerRecords(t *testing.T) {
	dir := t.TempDir()
	run := filepath.Join(dir, "run")
	record := filepath.Join(run, userspaceDir, "_volumes", "pvc-1.json")
	if err := os.MkdirAll(filepath.Dir(record), 0o700); err != nil {
		t.Fatal(err)
	}
	content := []byte(`{"version":2,"transport":"fuse"}`)
	if err := os.WriteFile(record, content, 0o600); err != nil {
		t.Fatal(err)
	}
	csiSock := filepath.Join(dir, "csi.sock")
	cfg := Config{
		NodeName: "n1", Namespace: "berth-system", DataDirs: []string{filepath.Join(dir, "data")}, RunDir: run,
		CSIEndpoint: "unix://" + csiSock, KubeletDir: filepath.Join(dir, "kubelet"), AgentSocket: filepath.Join(run, "agent.sock"),
		BlockdevBinary: "/bin/true", KeeperSocket: filepath.Join(dir, "keeper.sock"),
		Rest: &rest.Config{Host: "https://127.0.0.1:1"}, Log: testr.New(t),
	}
	err := cfg.Run(testenv.Context(t, 30*time.Second))
	if !errors.Is(err, nodeagent.ErrNewerRecords) || !strings.Contains(err.Error(), "pvc-1.json is version 2") {
		t.Fatalf("Run with a version 2 record: %v, want ErrNewerRecords naming it", err)
	}
	if _, err := os.Stat(csiSock); !os.IsNotExist(err) {
		t.Errorf("CSI socket of an agent that refused to start: %v", err)
	}
	if got, err := os.ReadFile(record); err != nil || string(got) != string(content) {
		t.Errorf("record after the refusal: %q, %v", got, err)
	}
}
