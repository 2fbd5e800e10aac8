// Package flexvolume tests berth's Flexvolume path end to end: a real
// `berth agent` process installs the driver, and the test runs the installed
// file exactly as kubelet does, with real mounts and a real API server.
package flexvolume

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/moby/sys/mountinfo"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/berth-io/berth/api/v1alpha1"
	"github.com/berth-io/berth/internal/agent/socket"
	flex "github.com/berth-io/berth/internal/flexvolume"
	"github.com/berth-io/berth/internal/testenv"
)

const node = "flex-node"

type fixture struct {
	env        *testenv.Env
	dir        string
	driver     string
	sock       string
	kubeletDir string
	agent      *testenv.Process
	agentArgs  []string
	agentLog   string
	operator   *testenv.Process
	// The agent's and the operator's metrics and health endpoints.
	agentMetrics, agentHealth, opMetrics, opHealth string
}

var (
	// fx is one agent process on one API server, shared by the tests here.
	fx    fixture
	suite = &testenv.Suite{Devices: []string{"/dev/loop-control"}, Setup: fx.start, Teardown: fx.stop}
)

func TestMain(m *testing.M) { os.Exit(testenv.Main(m, suite)) }

func (f *fixture) start(env *testenv.Env) error {
	f.env = env
	host, err := env.NewBerthHost("berth-flex-", node)
	f.dir = host.Dir
	if err != nil {
		return err
	}
	berth, kubeconfig := host.Berth, host.Kubeconfig
	plugins := filepath.Join(f.dir, "volume-plugins")
	f.sock = filepath.Join(f.dir, "run", "agent.sock")
	f.kubeletDir = filepath.Join(f.dir, "kubelet")
	f.driver = filepath.Join(plugins, flex.Dir, flex.Name)
	f.agentLog = filepath.Join(f.dir, "agent.log")
	for _, addr := range []*string{&f.agentMetrics, &f.agentHealth, &f.opMetrics, &f.opHealth} {
		if *addr, err = testenv.FreeAddr(); err != nil {
			return err
		}
	}
	f.agentArgs = []string{berth, "agent", "--kubeconfig", kubeconfig, "--node-name", node,
		"--data-dir", f.dataDir(), "--run-dir", filepath.Join(f.dir, "run"), "--csi-endpoint", "unix://" + filepath.Join(f.dir, "csi.sock"),
		"--kubelet-dir", f.kubeletDir, "--agent-socket", f.sock, "--volume-plugin-dir", plugins, "--stale-interval", "1s",
		"--metrics-addr", f.agentMetrics, "--health-addr", f.agentHealth}
	if err := f.startAgent(); err != nil {
		return err
	}
	// The operator lifts a deleted StorageCluster's finalizer once every
	// node reported its cleanup.
	if err := f.env.Client.Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "berth-system"}}); err != nil {
		return err
	}
	if f.operator, err = testenv.StartProcess(filepath.Join(f.dir, "operator.log"), berth, "operator", "--kubeconfig", kubeconfig,
		"--namespace", "berth-system", "--leader-elect=false", "--health-addr", f.opHealth, "--metrics-addr", f.opMetrics); err != nil {
		return err
	}
	return f.waitReady()
}

// startAgent starts the agent process (again, after a restart).
// dataDir is the agent's data dir, the one of every StorageCluster a test makes.
func (f *fixture) dataDir() string { return filepath.Join(f.dir, "data") }

func (f *fixture) startAgent() (err error) {
	f.agent, err = testenv.StartProcess(f.agentLog, f.agentArgs...)
	return err
}

// stopAgent stops the agent process by PID (SIGTERM, SIGKILL after 10s).
func (f *fixture) stopAgent() { f.signalAgent(syscall.SIGTERM) }

// signalAgent sends sig to the agent process (SIGKILL: a crash, which
// leaves its socket file behind) and waits for its exit (SIGKILL after 10s).
func (f *fixture) signalAgent(sig syscall.Signal) {
	f.agent.Stop(sig, 10*time.Second)
	f.agent = nil
}

// agentDown stops the agent with sig (signalAgent) and returns agentBack,
// which starts it again and waits until it is ready; a test that does not
// call agentBack has its cleanup start the agent for the next test.
func (f *fixture) agentDown(t *testing.T, sig syscall.Signal) (agentBack func()) {
	t.Helper()
	f.signalAgent(sig)
	running := false
	t.Cleanup(func() {
		if !running {
			_ = f.startAgent()
			_ = f.waitReady()
		}
	})
	return func() {
		t.Helper()
		if err := f.startAgent(); err != nil {
			t.Fatal(err)
		}
		running = true
		if err := f.waitReady(); err != nil {
			t.Fatal(err)
		}
	}
}

// waitReady waits until the installed driver's init reaches the agent.
func (f *fixture) waitReady() error {
	deadline := time.Now().Add(60 * time.Second)
	for {
		out, _ := exec.Command(f.driver, "init").Output()
		var res flex.Result
		if json.Unmarshal(out, &res) == nil && strings.HasPrefix(res.Message, "agent ready") {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the agent did not install a working driver within 60s")
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func (f *fixture) stop(failed bool) error {
	f.stopAgent()
	f.operator.Stop(syscall.SIGTERM, 30*time.Second)
	if failed && f.agentLog != "" {
		for _, name := range []string{f.agentLog, filepath.Join(f.dir, "operator.log")} {
			b, _ := os.ReadFile(name)
			fmt.Fprintf(os.Stderr, "%s:\n%s\n", name, b)
		}
	}
	if f.dir != "" {
		removeLeftovers(f.dir)
		_ = os.RemoveAll(f.dir)
	}
	return nil
}

func setup(t *testing.T) *fixture {
	t.Helper()
	suite.Require(t)
	return &fx
}

// run executes the installed driver as kubelet does and parses its output.
func (f *fixture) run(t *testing.T, args ...string) (flex.Result, string) {
	t.Helper()
	return runAs(t, exec.Command(f.driver, args...))
}

// runAs runs the driver and checks its output as kubelet reads it: stdout and
// stderr together (CombinedOutput) must be exactly one JSON object, whatever
// the outcome; a word on stderr would make kubelet drop berth's message.
func runAs(t *testing.T, cmd *exec.Cmd) (flex.Result, string) {
	t.Helper()
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, _ := cmd.Output()
	if stderr.Len() > 0 {
		t.Fatalf("driver %v wrote to stderr, which kubelet parses with stdout: %q (stdout %q)", cmd.Args[1:], stderr.String(), out)
	}
	var res flex.Result
	dec := json.NewDecoder(bytes.NewReader(out))
	if err := dec.Decode(&res); err != nil {
		t.Fatalf("driver output is not a JSON object: %q (%v)", out, err)
	}
	if rest := out[dec.InputOffset():]; len(bytes.TrimSpace(rest)) > 0 {
		t.Fatalf("driver printed more than one JSON object: %q", out)
	}
	return res, stderr.String()
}

// volume makes a Volume that pods of namespace "default" may mount.
func (f *fixture) volume(t *testing.T, cluster, name string, mode v1.AccessMode) string {
	t.Helper()
	return f.volumeOf(t, cluster, name, mode, "default")
}

// volumeOf makes a Volume owned by namespace ns ("": by none) and returns
// its image path.
func (f *fixture) volumeOf(t *testing.T, cluster, name string, mode v1.AccessMode, ns string) string {
	t.Helper()
	labels := map[string]string{v1.NodeLabel: node}
	if ns != "" {
		labels[v1.NamespaceLabel] = ns
	}
	vol := &v1.Volume{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels},
		Spec:       v1.VolumeSpec{StorageCluster: cluster, Size: resource.MustParse("64Mi"), AccessMode: mode, FSType: "ext4", Node: node},
	}
	f.env.AgentVolume(t, vol)
	return vol.Status.Path
}

func (f *fixture) podDir(uid, volume string) string {
	return filepath.Join(f.kubeletDir, "pods", uid, "volumes", flex.Dir, volume)
}

func options(t *testing.T, pod, uid, volume string) string {
	t.Helper()
	return optionsWith(t, pod, uid, volume, nil)
}

// optionsWith is options with some of kubelet's (or berth's) options set
// otherwise.
func optionsWith(t *testing.T, pod, uid, volume string, extra map[string]string) string {
	t.Helper()
	opts := map[string]string{
		flex.OptFSType: "ext4", flex.OptReadWrite: "rw", flex.OptPodName: pod, flex.OptPodNamespace: "default",
		flex.OptPodUID: uid, flex.OptVolumeName: volume, "kubernetes.io/serviceAccount.name": "default",
	}
	for k, v := range extra {
		opts[k] = v
	}
	b, err := json.Marshal(opts)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func mounted(t *testing.T, path string) bool {
	t.Helper()
	ms, err := mountinfo.GetMounts(mountinfo.SingleEntryFilter(path))
	if err != nil {
		t.Fatal(err)
	}
	return len(ms) != 0
}

func loops(t *testing.T, image string) int {
	t.Helper()
	return len(testenv.LoopsOf(t, image))
}

func want(t *testing.T, what string, res flex.Result, status string) {
	t.Helper()
	if res.Status != status {
		t.Fatalf("%s: %s (%s), want %s", what, res.Status, res.Message, status)
	}
}

// TestKubeletCalls: init, mount, a second pod's conflicting mount refused,
// unmount, and an idempotent repeat of each, as kubelet calls them.
func TestKubeletCalls(t *testing.T) {
	f := setup(t)
	image := f.volume(t, "flex", "flex-rwop", v1.ReadWriteOncePod)

	res, _ := f.run(t, "init")
	want(t, "init", res, flex.StatusSuccess)
	if res.Capabilities == nil || res.Capabilities.Attach {
		t.Fatalf("init capabilities = %+v, want attach false", res.Capabilities)
	}
	res, _ = f.run(t, "attach", "{}", node)
	want(t, "attach", res, flex.StatusNotSupported)

	uidA := f.pod(t, podSpec{ns: "default", name: "web-a", volume: inline("flex-rwop", "")})
	uidB := f.pod(t, podSpec{ns: "default", name: "web-b", volume: inline("flex-rwop", "")})
	dirA, dirB := f.podDir(uidA, "flex-rwop"), f.podDir(uidB, "flex-rwop")
	for i := range 2 {
		res, _ = f.run(t, "mount", dirA, options(t, "web-a", uidA, "flex-rwop"))
		want(t, fmt.Sprintf("mount #%d", i+1), res, flex.StatusSuccess)
	}
	if !mounted(t, dirA) || loops(t, image) != 1 {
		t.Fatalf("after mount: mounted %t, loop devices %d", mounted(t, dirA), loops(t, image))
	}
	if err := os.WriteFile(filepath.Join(dirA, "hello"), []byte("berth"), 0o600); err != nil {
		t.Fatal(err)
	}
	// The Attachment's status says where the volume is staged.
	staged := &v1.Attachment{}
	if err := f.env.Client.Get(context.Background(), client.ObjectKey{Name: "flex-rwop"}, staged); err != nil {
		t.Fatal(err)
	}
	if st := staged.Status.Nodes; len(st) != 1 || st[0].Node != node || !strings.HasPrefix(st[0].DevicePath, "/dev/loop") ||
		!st[0].Staged || st[0].StagingPath == "" || staged.Status.Devices != node+"="+st[0].DevicePath {
		t.Errorf("Attachment status after mount: %+v", staged.Status)
	}

	res, _ = f.run(t, "mount", dirB, options(t, "web-b", uidB, "flex-rwop"))
	want(t, "second pod's mount of a ReadWriteOncePod volume", res, flex.StatusFailure)
	if !strings.Contains(res.Message, "web-a") || !strings.Contains(res.Message, node) {
		t.Errorf("refusal does not name the holder (pod web-a on %s): %s", node, res.Message)
	}
	if mounted(t, dirB) {
		t.Error("refused mount left a mount behind")
	}

	for i := range 2 {
		res, _ = f.run(t, "unmount", dirA)
		want(t, fmt.Sprintf("unmount #%d", i+1), res, flex.StatusSuccess)
	}
	if mounted(t, dirA) || loops(t, image) != 0 {
		t.Fatalf("after unmount: mounted %t, loop devices %d", mounted(t, dirA), loops(t, image))
	}
	att := &v1.Attachment{}
	if err := f.env.Client.Get(context.Background(), client.ObjectKey{Name: "flex-rwop"}, att); !apierrors.IsNotFound(err) {
		t.Errorf("Attachment left after the last unmount: %+v (%v)", att.Spec.Attachments, err)
	}

	// The second pod may mount now that the first is gone.
	res, _ = f.run(t, "mount", dirB, options(t, "web-b", uidB, "flex-rwop"))
	want(t, "mount by the second pod after the first left", res, flex.StatusSuccess)
	if b, err := os.ReadFile(filepath.Join(dirB, "hello")); err != nil || string(b) != "berth" {
		t.Errorf("data written by the first pod: %q %v", b, err)
	}
	res, _ = f.run(t, "unmount", dirB)
	want(t, "unmount of the second pod", res, flex.StatusSuccess)
}

// TestSocketRefusals: non-root clients are refused, and garbage or oversized
// requests get an error while the agent keeps serving.
func TestSocketRefusals(t *testing.T) {
	f := setup(t)
	if _, err := exec.LookPath("setpriv"); err != nil {
		t.Skip("setpriv (util-linux) missing")
	}
	// Let uid 65534 reach the driver (test folders are 0700).
	for p := f.dir; p != "/" && p != os.TempDir(); p = filepath.Dir(p) {
		if err := os.Chmod(p, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	nobody := func(args ...string) *exec.Cmd {
		return exec.Command("setpriv", append([]string{"--reuid", "65534", "--regid", "65534", "--clear-groups", f.driver}, args...)...)
	}
	res, _ := runAs(t, nobody("mount", f.podDir("cccccccc-0003", "x"), options(t, "p", "cccccccc-0003", "x")))
	want(t, "non-root mount", res, flex.StatusFailure)

	// Even with the folder and socket opened up, the peer check refuses.
	dir := filepath.Dir(f.sock)
	for _, p := range []string{dir, f.sock} {
		if err := os.Chmod(p, 0o777); err != nil {
			t.Fatal(err)
		}
	}
	res, _ = runAs(t, nobody("init"))
	if !strings.Contains(res.Message, "uid 65534 may not use the agent socket") {
		t.Errorf("non-root handshake through an open socket: %q, want a refusal by uid", res.Message)
	}
	if err := os.Chmod(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(f.sock, 0o600); err != nil {
		t.Fatal(err)
	}

	junk := make([]byte, 4096)
	if _, err := rand.Read(junk); err != nil {
		t.Fatal(err)
	}
	for name, payload := range map[string][]byte{
		"random bytes":  append(junk, '\n'),
		"oversized":     []byte(`{"op":"mount","mountDir":"` + strings.Repeat("a", socket.MaxRequestBytes) + "\"}\n"),
		"unknown op":    []byte(`{"op":"format-everything"}` + "\n"),
		"unknown field": []byte(`{"op":"handshake","force":true}` + "\n"),
	} {
		resp := raw(t, f.sock, payload)
		if resp.OK || resp.Code != socket.CodeInvalid {
			t.Errorf("%s: %+v, want an Invalid error", name, resp)
		}
	}
	resp, err := socket.Call(context.Background(), f.sock, socket.Request{Op: socket.OpHandshake})
	if err != nil || !resp.OK || resp.Node != node {
		t.Fatalf("handshake after the bad requests: %+v %v", resp, err)
	}
}

func raw(t *testing.T, sock string, payload []byte) socket.Response {
	t.Helper()
	c, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	_, _ = c.Write(payload) // the agent may stop reading early
	var resp socket.Response
	if err := json.NewDecoder(c).Decode(&resp); err != nil {
		t.Fatalf("no response: %v", err)
	}
	return resp
}

// removeLeftovers unmounts and detaches whatever a failed test left under
// dir, so that a failure never leaks mounts or loop devices.
func removeLeftovers(dir string) {
	ms, _ := mountinfo.GetMounts(mountinfo.PrefixFilter(dir))
	for i := len(ms) - 1; i >= 0; i-- {
		_ = syscall.Unmount(ms[i].Mountpoint, syscall.MNT_DETACH)
	}
	out, _ := exec.Command("losetup", "-a").Output()
	for _, l := range strings.Split(string(out), "\n") {
		if dev, _, ok := strings.Cut(l, ":"); ok && strings.Contains(l, dir) {
			_ = exec.Command("losetup", "-d", dev).Run()
		}
	}
}
