// Package userspace tests userspace volumes end to end: a real keeper and a
// real `berth agent` process on a real API server, volumes staged and
// published through the agent's CSI node socket, and the agent plus every
// blockdev server SIGKILLed again and again under verifying writers.
package userspace

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/moby/sys/mountinfo"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/berth-io/berth/internal/keeper"
	"github.com/berth-io/berth/internal/testenv"
)

const node = "us-node"

// fixture is one API server, one keeper process and one agent process
// (restarted by the tests), shared by the tests here.
type fixture struct {
	env        *testenv.Env
	dir        string
	berth      string
	kubeconfig string
	keeperSock string
	csiSock    string
	keeperCmd  *exec.Cmd
	keeperDone chan struct{}
	agent      *exec.Cmd
	agentDone  chan struct{}
	agentLog   string
	// agentPath, when set, is the agent's PATH (a test's tool wrappers first).
	agentPath string
	// agentMetrics is the agent's metrics endpoint, the same across restarts.
	agentMetrics string
	// agentFlags go to every agent start: BERTH_BLOCKDEV_PASSTHROUGH, when
	// set, picks the userspace data path for the whole run (make bench
	// measures healing with passthrough on and off).
	agentFlags []string
	// atEnd run once every test is done (a test Ceph to stop).
	atEnd []func()
}

var (
	fx    fixture
	suite = &testenv.Suite{Devices: []string{"/dev/loop-control", "/dev/fuse"}, Setup: fx.start, Teardown: fx.stop}
)

func TestMain(m *testing.M) { os.Exit(testenv.Main(m, suite)) }

func (f *fixture) start(env *testenv.Env) error {
	f.env = env
	// berth as `make build` builds it (with the ceph backend unless
	// BERTH_CEPH=0).
	host, err := env.NewBerthHost("berth-us-", node)
	f.dir, f.berth, f.kubeconfig = host.Dir, host.Berth, host.Kubeconfig
	if err != nil {
		return err
	}
	f.keeperSock = filepath.Join(f.dir, "run", "keeper.sock")
	f.csiSock = filepath.Join(f.dir, "csi.sock")
	f.agentLog = filepath.Join(f.dir, "agent.log")
	if f.agentMetrics, err = testenv.FreeAddr(); err != nil {
		return err
	}
	if v := os.Getenv("BERTH_BLOCKDEV_PASSTHROUGH"); v != "" {
		f.agentFlags = append(f.agentFlags, "--blockdev-passthrough="+v)
	}
	if err := f.startKeeper(); err != nil {
		return err
	}
	return f.startAgent()
}

func (f *fixture) startKeeper() error {
	log, err := os.OpenFile(filepath.Join(f.dir, "keeper.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer func() { _ = log.Close() }()
	f.keeperCmd = exec.Command(f.berth, "keeper", "--socket", f.keeperSock)
	f.keeperCmd.Stdout, f.keeperCmd.Stderr = log, log
	f.keeperCmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := f.keeperCmd.Start(); err != nil {
		return err
	}
	f.keeperDone = make(chan struct{})
	go func() { _ = f.keeperCmd.Wait(); close(f.keeperDone) }()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for keeper.NewClient(f.keeperSock).Ping(ctx) != nil {
		select {
		case <-ctx.Done():
			return errors.New("keeper did not answer within 10s")
		case <-time.After(20 * time.Millisecond):
		}
	}
	return nil
}

// kubeletRoot is the agent's kubelet root: it stages and publishes only
// under kubelet's folders for CSI volumes there.
func (f *fixture) kubeletRoot() string { return filepath.Join(f.dir, "kubelet") }

// stagingPath is kubelet's staging path of a CSI volume of berth's.
func (f *fixture) stagingPath(name string) string {
	return filepath.Join(f.kubeletRoot(), "plugins", "kubernetes.io", "csi", "berth.io", name, "globalmount")
}

// startAgent starts the agent process, with extra flags; it returns
// without waiting for it.
// holdersDir is the agent's folder of netns-mode clusters' holder records.
func (f *fixture) holdersDir() string { return filepath.Join(f.dir, "holders-netns") }

func (f *fixture) startAgent(extra ...string) error {
	log, err := os.OpenFile(f.agentLog, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer func() { _ = log.Close() }()
	args := []string{"agent", "--kubeconfig", f.kubeconfig, "--node-name", node,
		"--data-dir", filepath.Join(f.dir, "data"), "--run-dir", filepath.Join(f.dir, "run"), "--csi-endpoint", "unix://" + f.csiSock,
		"--kubelet-dir", f.kubeletRoot(), "--agent-socket", filepath.Join(f.dir, "run", "agent.sock"), "--volume-plugin-dir", "",
		"--keeper-socket", f.keeperSock, "--capacity-interval", "1h", "--heal-interval", "2s",
		"--holder-netns-dir", f.holdersDir(),
		// Not the default ports: another agent on this machine may have them.
		"--metrics-addr", f.agentMetrics, "--health-addr", "0"}
	args = append(args, f.agentFlags...)
	f.agent = exec.Command(f.berth, append(args, extra...)...)
	f.agent.Stdout, f.agent.Stderr = log, log
	if f.agentPath != "" {
		f.agent.Env = append(os.Environ(), "PATH="+f.agentPath)
	}
	// Its own group; the servers it starts make their own too.
	f.agent.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := f.agent.Start(); err != nil {
		return err
	}
	done := make(chan struct{})
	f.agentDone = done
	cmd := f.agent
	go func() { _ = cmd.Wait(); close(done) }()
	return nil
}

// killAll SIGKILLs the agent and every blockdev server the keeper lists,
// and waits until they are gone.
func (f *fixture) killAll(ctx context.Context) error {
	f.killAgent()
	vols, err := keeper.NewClient(f.keeperSock).List(ctx)
	if err != nil {
		return err
	}
	for _, v := range vols {
		if v.ServerPID != 0 {
			if err := killWait(v.ServerPID); err != nil {
				return err
			}
		}
	}
	return nil
}

// crash SIGKILLs the agent and every blockdev server (killAll); cleanup
// starts the agent again when the test leaves it down.
func (f *fixture) crash(t *testing.T) {
	t.Helper()
	if err := f.killAll(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if f.agent == nil {
			_ = f.startAgent()
		}
	})
}

// stopAgent asks the agent to exit (SIGTERM) and kills it after 10s.
func (f *fixture) stopAgent() {
	if f.agent == nil {
		return
	}
	_ = f.agent.Process.Signal(syscall.SIGTERM)
	select {
	case <-f.agentDone:
	case <-time.After(10 * time.Second):
		_ = f.agent.Process.Kill()
		<-f.agentDone
	}
	f.agent = nil
}

// killAgent SIGKILLs the agent (what a crash looks like) and waits for it.
func (f *fixture) killAgent() {
	if f.agent != nil {
		_ = f.agent.Process.Signal(syscall.SIGKILL)
		<-f.agentDone
		f.agent = nil
	}
}

// killWait SIGKILLs pid through a pidfd (never a reused pid) and waits for
// its exit.
func killWait(pid int) error {
	fd, err := unix.PidfdOpen(pid, 0)
	if errors.Is(err, unix.ESRCH) {
		return nil
	}
	if err != nil {
		return err
	}
	defer func() { _ = unix.Close(fd) }()
	if err := unix.PidfdSendSignal(fd, unix.SIGKILL, nil, 0); err != nil && !errors.Is(err, unix.ESRCH) {
		return err
	}
	fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
	deadline := time.Now().Add(10 * time.Second)
	var n int
	for {
		n, err = unix.Poll(fds, int(max(time.Until(deadline), 0)/time.Millisecond))
		// The Go runtime's own signals interrupt poll: wait on.
		if !errors.Is(err, unix.EINTR) {
			break
		}
	}
	if err != nil {
		return fmt.Errorf("wait for server %d: %w", pid, err)
	}
	if n == 0 {
		return fmt.Errorf("server %d did not exit within 10s of SIGKILL", pid)
	}
	return nil
}

// node is a client of the agent's CSI node service, returned once the
// service answers.
func (f *fixture) node(t *testing.T) csi.NodeClient {
	t.Helper()
	c, err := grpc.NewClient("unix://"+f.csiSock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	nc := csi.NewNodeClient(c)
	waitCSI(t, nc)
	return nc
}

// stop removes everything, in order: mounts above loop devices, loop
// devices, servers, keeper (its connections with it), API server, files.
func (f *fixture) stop(failed bool) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	f.stopAgent()
	// BERTH_KEEP_AGENT_LOG=FILE keeps the agent's log of a passing run too
	// (a heal's timeline is read from it; the folder is removed below).
	if keep := os.Getenv("BERTH_KEEP_AGENT_LOG"); keep != "" {
		b, _ := os.ReadFile(f.agentLog)
		_ = os.WriteFile(keep, b, 0o600)
	}
	if failed && f.agentLog != "" {
		b, _ := os.ReadFile(f.agentLog)
		fmt.Fprintf(os.Stderr, "agent log (tail):\n%s\n", tail(string(b), 8000))
	}
	if f.dir != "" {
		unmountUnder(f.dir, func(fstype string) bool { return fstype != "fuse.berth" && !strings.HasPrefix(fstype, "fuse") })
		detachLoopsUnder(f.dir)
	}
	if f.keeperCmd != nil {
		if vols, err := keeper.NewClient(f.keeperSock).List(ctx); err == nil {
			for _, v := range vols {
				if v.ServerPID != 0 {
					_ = killWait(v.ServerPID)
				}
				_ = keeper.NewClient(f.keeperSock).Close(ctx, v.Name)
			}
		}
		_ = f.keeperCmd.Process.Signal(syscall.SIGKILL)
		<-f.keeperDone
	}
	if f.dir != "" {
		unmountUnder(f.dir, func(string) bool { return true })
	}
	if f.dir != "" {
		_ = os.RemoveAll(f.dir)
	}
	for _, end := range f.atEnd {
		end()
	}
	return nil
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

// mountsUnder returns mountpoints below dir (deepest first) with fs types.
func mountsUnder(dir string) (points, types []string) {
	ms, err := mountinfo.GetMounts(func(m *mountinfo.Info) (skip, stop bool) {
		return !strings.HasPrefix(m.Mountpoint, dir+"/"), false
	})
	if err != nil {
		return nil, nil
	}
	for _, m := range ms {
		points = append([]string{m.Mountpoint}, points...)
		types = append([]string{m.FSType}, types...)
	}
	return points, types
}

// mountSource is the device mounted at mountpoint ("" if none).
func mountSource(mountpoint string) string {
	ms, err := mountinfo.GetMounts(mountinfo.SingleEntryFilter(mountpoint))
	if err != nil || len(ms) == 0 {
		return ""
	}
	return ms[0].Source
}

func unmountUnder(dir string, which func(fstype string) bool) {
	points, types := mountsUnder(dir)
	for i, p := range points {
		if which(types[i]) {
			if err := unix.Unmount(p, 0); err != nil {
				_ = unix.Unmount(p, unix.MNT_DETACH)
			}
		}
	}
}

// detachLoopsUnder frees loop devices whose backing file is below dir.
func detachLoopsUnder(dir string) {
	ms, _ := filepath.Glob("/sys/block/loop*/loop/backing_file")
	for _, m := range ms {
		b, err := os.ReadFile(m)
		if err != nil || !strings.HasPrefix(strings.TrimSpace(string(b)), dir+"/") {
			continue
		}
		dev := "/dev/" + filepath.Base(filepath.Dir(filepath.Dir(m)))
		_ = exec.Command("losetup", "-d", dev).Run()
	}
}
