package userspace

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/berth-io/berth/api/v1alpha1"
	"github.com/berth-io/berth/internal/keeper"
)

// TestServerKilledDuringMkfs: the blockdev server of a volume being staged
// dies while mkfs runs, so mkfs waits on I/O no one answers while the stage
// holds the volume lock. The healer must still heal the node's other
// volumes (it skips the busy one), and the stage must end (mkfs killed at
// its deadline) leaving nothing behind: no loop device, FUSE connection,
// mount, record or Attachment entry.
func TestServerKilledDuringMkfs(t *testing.T) {
	f := setup(t)
	f.stopAgent()
	// mkfs.ext4 stops itself before it runs: caught every time, however
	// fast the real one would be (polling for it lost the race under load).
	wrappers := stoppingMkfs(t, "mkfs.ext4")
	f.agentPath = wrappers + ":" + os.Getenv("PATH")
	t.Cleanup(func() { f.agentPath = "" })
	if err := f.startAgent("--format-timeout=20s", "--losetup-timeout=5s", "--probe-timeout=5s", "--background-lock-wait=1s"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		f.stopAgent()
		if err := f.startAgent(); err != nil {
			t.Error(err)
		}
	})
	nc := f.node(t)
	other := f.userspaceVolume(t, nc, "dl-other")
	ctx := context.Background()
	kc := keeper.NewClient(f.keeperSock)

	// Big, so that mkfs runs long enough to be caught.
	const name = "dl-victim"
	vol := volumeObject(name, "ext4", "16Gi", v1.MounterUserspace)
	if err := f.env.Client.Create(ctx, vol); err != nil {
		t.Fatal(err)
	}
	staging := f.stagingPath(name)
	t.Cleanup(func() {
		waitCSI(t, nc)
		_ = retryBusy(func() error {
			_, err := nc.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: name, StagingTargetPath: staging})
			return err
		})
		_ = f.env.Client.Delete(ctx, vol)
	})
	f.env.WaitVolumeAvailable(t, vol)
	if err := os.MkdirAll(staging, 0o750); err != nil {
		t.Fatal(err)
	}
	agentPID := f.agent.Process.Pid
	armStoppingMkfs(t, wrappers)
	staged := make(chan error, 1)
	go func() {
		sctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
		defer cancel()
		_, err := nc.NodeStageVolume(sctx, &csi.NodeStageVolumeRequest{VolumeId: name, StagingTargetPath: staging, VolumeCapability: mountCap()})
		staged <- err
	}()

	// Catch mkfs (stopped by its wrapper), hold it while its server dies,
	// let it go on.
	mkfs := waitChild(t, agentPID, "mkfs.", staged)
	mkfsFD, err := unix.PidfdOpen(mkfs, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = unix.Close(mkfsFD) }()
	if err := killWait(serverPID(t, kc, name)); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(mkfs, syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	t.Logf("server of %s killed during mkfs (pid %d)", name, mkfs)

	// A heal pass has met the busy volume by now; the other volume's server
	// dies after that, and must be healed all the same.
	time.Sleep(3 * time.Second)
	if err := killWait(serverPID(t, kc, other.name)); err != nil {
		t.Fatal(err)
	}
	otherKilled := time.Now()
	for serverPIDOrZero(t, kc, other.name) == 0 {
		if time.Since(otherKilled) > 20*time.Second {
			t.Fatalf("the healer did not heal %s within 20s while %s was stuck in mkfs", other.name, name)
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("%s healed %s after its server died, %s after %s's server died", other.name,
		time.Since(otherKilled).Round(time.Millisecond), time.Since(killed).Round(time.Millisecond), name)

	select {
	case err := <-staged:
		t.Logf("stage of %s ended after %s: %v", name, time.Since(killed).Round(time.Millisecond), err)
		if err == nil {
			return // it completed: nothing to check for leftovers
		}
	case <-time.After(time.Minute):
		t.Fatalf("stage of %s still hangs a minute after its server died during mkfs", name)
	}
	checkNothingLeft(t, f, kc, name, staging, mkfsFD)
}

// checkNothingLeft checks that a failed userspace stage left nothing.
func checkNothingLeft(t *testing.T, f *fixture, kc *keeper.Client, name, staging string, mkfsFD int) {
	t.Helper()
	// mkfs exits once the keeper closes the connection (its I/O fails).
	if !pidfdExited(mkfsFD, 20*time.Second) {
		t.Errorf("mkfs still runs 20s after the stage failed")
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		left := leftovers(t, f, kc, name, staging)
		if len(left) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("failed stage of %s left: %v", name, left)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func leftovers(t *testing.T, f *fixture, kc *keeper.Client, name, staging string) []string {
	t.Helper()
	ctx := context.Background()
	var left []string
	vols, err := kc.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if slices.ContainsFunc(vols, func(v keeper.Volume) bool { return v.Name == name }) {
		left = append(left, "keeper connection")
	}
	mp := filepath.Join(f.dir, "run", "blockdev", name)
	ms, _ := filepath.Glob("/sys/block/loop*/loop/backing_file")
	for _, m := range ms {
		if b, err := os.ReadFile(m); err == nil && strings.HasPrefix(strings.TrimSpace(string(b)), mp) {
			left = append(left, "loop device "+filepath.Base(filepath.Dir(filepath.Dir(m))))
		}
	}
	points, _ := mountsUnder(f.dir)
	for _, p := range points {
		if p == staging || p == mp {
			left = append(left, "mount "+p)
		}
	}
	record := filepath.Join(f.dir, "run", "blockdev", "_volumes", name+".json")
	for _, p := range []string{mp + ".log", mp, record} {
		if _, err := os.Lstat(p); err == nil {
			left = append(left, "file "+p)
		}
	}
	att := &v1.Attachment{}
	if err := f.env.Client.Get(ctx, client.ObjectKey{Name: name}, att); err == nil {
		for _, e := range att.Spec.Attachments {
			if e.Node == node {
				left = append(left, "attachment entry "+e.MountDir)
			}
		}
	} else if !apierrors.IsNotFound(err) {
		t.Fatal(err)
	}
	return left
}

// stoppingMkfs writes a folder holding a wrapper named tool that, once
// armed (armStoppingMkfs), stops itself (SIGSTOP) on its next run and, once
// continued, execs the real tool in its place; unarmed it just runs it.
func stoppingMkfs(t *testing.T, tool string) string {
	t.Helper()
	real, err := exec.LookPath(tool)
	if err != nil {
		t.Skipf("%s not installed: %v", tool, err)
	}
	dir := t.TempDir()
	armed := filepath.Join(dir, "armed")
	script := "#!/bin/sh\nif rm " + armed + " 2>/dev/null; then kill -STOP $$; fi\nexec " + real + " \"$@\"\n"
	if err := os.WriteFile(filepath.Join(dir, tool), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

func armStoppingMkfs(t *testing.T, dir string) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(dir, "armed"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
}

// waitChild returns the pid of a stopped child of parent that runs a
// program whose name starts with prefix (a wrapper from stoppingMkfs);
// it fails if ended yields first.
func waitChild(t *testing.T, parent int, prefix string, ended <-chan error) int {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for time.Now().Before(deadline) {
		select {
		case err := <-ended:
			t.Fatalf("the stage ended (%v) before a %s process was seen", err, prefix)
		default:
		}
		entries, _ := os.ReadDir("/proc")
		for _, e := range entries {
			pid, err := strconv.Atoi(e.Name())
			if err != nil {
				continue
			}
			cmd, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
			if err != nil || ppid(pid) != parent || !stopped(pid) {
				continue
			}
			// The wrapper runs as "/bin/sh <dir>/mkfs.ext4 ...".
			args := strings.SplitN(string(cmd), "\x00", 3)
			for _, arg := range args[:min(2, len(args))] {
				if strings.HasPrefix(filepath.Base(arg), prefix) {
					return pid
				}
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("no stopped %s process of pid %d within a minute", prefix, parent)
	return 0
}

// procStat is the fields of /proc/PID/stat after the command: state first,
// then the parent's pid.
func procStat(pid int) []string {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return nil
	}
	// The command may hold spaces and parentheses: fields follow the last ')'.
	s := string(b)
	return strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
}

func ppid(pid int) int {
	f := procStat(pid)
	if len(f) < 2 {
		return 0
	}
	p, _ := strconv.Atoi(f[1])
	return p
}

func stopped(pid int) bool {
	f := procStat(pid)
	return len(f) > 0 && f[0] == "T"
}

func serverPID(t *testing.T, kc *keeper.Client, volume string) int {
	t.Helper()
	pid := serverPIDOrZero(t, kc, volume)
	if pid == 0 {
		t.Fatalf("keeper lists no server for %s", volume)
	}
	return pid
}

func serverPIDOrZero(t *testing.T, kc *keeper.Client, volume string) int {
	t.Helper()
	vols, err := kc.List(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if i := slices.IndexFunc(vols, func(v keeper.Volume) bool { return v.Name == volume }); i >= 0 {
		return vols[i].ServerPID
	}
	return 0
}

// pidfdExited tells whether the process of fd exits within wait.
func pidfdExited(fd int, wait time.Duration) bool {
	fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
	n, err := unix.Poll(fds, int(wait.Milliseconds()))
	return err == nil && n > 0
}
