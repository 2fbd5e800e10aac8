// Package testceph starts the test Ceph of hack/ceph (1 mon, 1 mgr, 3 OSDs,
// a replicated pool of size 3, cephx with a berth client limited to
// `profile rbd` on that pool) for tests that need a real Ceph, and drives it
// through its scripts: start once per test binary (TestMain), take OSDs down
// and back, stop every daemon by its recorded PID.
package testceph

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/berth-io/berth/internal/testenv"
)

// Options place a test Ceph; the zero value is not valid, see TestOptions.
type Options struct {
	// Dir holds every file of the cluster (data, logs, keys, sockets).
	Dir string
	// Addr is the address every daemon binds; Netns, when set, a network
	// namespace (made by the caller) the daemons run in.
	Addr, Netns string
	// MonPort is the monitor's msgr2 port; PortMin..PortMax the mgr's and
	// OSDs' ports.
	MonPort, PortMin, PortMax int
}

// TestOptions keep tests' Ceph apart from one brought up by hand with
// hack/ceph/up.sh (its own folder and ports).
func TestOptions() Options {
	return Options{Dir: "/var/lib/berth-ceph-test", Addr: "127.0.0.1", MonPort: 3310, PortMin: 6900, PortMax: 6999}
}

// Cluster is a running test Ceph, as hack/ceph/up.sh's env file describes it.
type Cluster struct {
	// MonHost is the monitors in Ceph's mon_host form ([v2:ADDR:PORT]).
	MonHost string
	// Monitors is ADDR:PORT of the monitor.
	Monitors string
	// Pool is the replicated pool (size 3, min_size 2, application rbd).
	Pool string
	// Client is the cephx id (client.<Client>) whose caps are `profile rbd`
	// on Pool only; Keyring its keyring (0600) and Conf a ceph.conf with
	// the monitors and no key.
	Client, Keyring, Conf string
	// NodeClient is the nodes' cephx id, `profile rbd` alone (it may put a
	// client on the blocklist, never take one off); NodeKeyring its keyring.
	NodeClient, NodeKeyring string
	// AdminKeyring and AdminConf are for checks a client cannot make.
	AdminKeyring, AdminConf string

	scripts, netns string
	env            []string
	// dir is the cluster's folder; lock, held from Up to Stop, keeps a
	// second test process (another package run, a worktree's) from
	// reusing or removing the same folder and ports meanwhile.
	dir  string
	lock *os.File
}

// Timeouts of the scripts: a cold start installs Debian's packages.
const (
	upTimeout   = 10 * time.Minute
	downTimeout = 2 * time.Minute
	osdTimeout  = 3 * time.Minute
)

// Packages are the Debian packages hack/ceph needs.
var packages = []string{"ceph-mon", "ceph-osd", "ceph-mgr", "ceph-common"}

// SkipReason says why a test Ceph cannot run here: -short, BERTH_CEPH=0,
// not root, or Debian's Ceph packages missing and not installable (it
// installs them when missing); "" when it can.
// Call it after flag.Parse.
func SkipReason(ctx context.Context) string {
	switch {
	case testing.Short():
		return "-short: needs a real Ceph (root, Debian's ceph packages)"
	case os.Getenv("BERTH_CEPH") == "0":
		return "BERTH_CEPH=0: the tests on a real Ceph are left out"
	case os.Geteuid() != 0:
		return "needs root: it runs Ceph daemons (hack/ceph)"
	}
	ctx, cancel := context.WithTimeout(ctx, upTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(testenv.RepoRoot(), "hack", "install-deps.sh"), packages...)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Sprintf("needs Debian's %s, which could not be installed: %v: %s",
			strings.Join(packages, " "), err, bytes.TrimSpace(out))
	}
	return ""
}

// New returns the test Ceph placed by o, not started yet (see Up); Stop
// cleans up after a failed Up too.
func New(o Options) *Cluster {
	return &Cluster{
		scripts: filepath.Join(testenv.RepoRoot(), "hack", "ceph"),
		netns:   o.Netns,
		dir:     o.Dir,
		env: append(os.Environ(),
			"BERTH_CEPH_DIR="+o.Dir,
			"BERTH_CEPH_ADDR="+o.Addr,
			"BERTH_CEPH_NETNS="+o.Netns,
			"BERTH_CEPH_MON_PORT="+strconv.Itoa(o.MonPort),
			"BERTH_CEPH_PORT_MIN="+strconv.Itoa(o.PortMin),
			"BERTH_CEPH_PORT_MAX="+strconv.Itoa(o.PortMax),
		),
	}
}

// Up brings the test Ceph up (or reuses the one already up in its folder)
// and waits until every placement group is active+clean.
func (c *Cluster) Up(ctx context.Context) error {
	if err := c.takeLock(ctx); err != nil {
		return err
	}
	out, err := c.script(ctx, upTimeout, "up.sh")
	if err != nil {
		return err
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	return c.readEnv(lines[len(lines)-1])
}

// Load describes the test Ceph that hack/ceph/up.sh brought up, from the
// env file it printed; the caller runs (and stops) it with the scripts.
func Load(envFile string) (*Cluster, error) {
	c := &Cluster{}
	return c, c.readEnv(envFile)
}

// Stop stops every daemon by its PID, removes the cluster's folder and
// proves nothing is left (hack/ceph/leftovers.sh).
func (c *Cluster) Stop(ctx context.Context) error {
	_, err := c.script(ctx, downTimeout, "down.sh")
	if _, lerr := c.script(ctx, downTimeout, "leftovers.sh"); lerr != nil {
		err = errors.Join(err, lerr)
	}
	if c.lock != nil {
		_ = c.lock.Close() // releases the flock
		c.lock = nil
	}
	return err
}

// lockWait bounds the wait for another test process's use of the same
// folder: a package's tests on a real Ceph take a few minutes.
const lockWait = 20 * time.Minute

// takeLock waits for the folder's lock (<dir>.lock, flock: a process that
// dies lets go of it).
func (c *Cluster) takeLock(ctx context.Context) error {
	if c.lock != nil || c.dir == "" {
		return nil
	}
	path := filepath.Clean(c.dir) + ".lock"
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return fmt.Errorf("test Ceph lock: %w", err)
	}
	deadline := time.Now().Add(lockWait)
	for said := false; ; {
		err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		if err == nil {
			c.lock = f
			return nil
		}
		if !errors.Is(err, unix.EWOULDBLOCK) || time.Now().After(deadline) {
			_ = f.Close()
			return fmt.Errorf("test Ceph in %s is in use by another test process (lock %s): %w", c.dir, path, err)
		}
		if !said {
			fmt.Fprintf(os.Stderr, "testceph: %s is in use by another test process; waiting up to %s\n", c.dir, lockWait)
			said = true
		}
		select {
		case <-ctx.Done():
			_ = f.Close()
			return ctx.Err()
		case <-time.After(time.Second):
		}
	}
}

// KillOSD kills OSD id with SIGKILL, as a crash would, and returns once the
// monitor has marked it down.
func (c *Cluster) KillOSD(ctx context.Context, id int) error {
	_, err := c.script(ctx, osdTimeout, "osd.sh", "kill", strconv.Itoa(id))
	return err
}

// StartOSD starts OSD id again and returns once it is up.
func (c *Cluster) StartOSD(ctx context.Context, id int) error {
	_, err := c.script(ctx, osdTimeout, "osd.sh", "start", strconv.Itoa(id))
	return err
}

// FreezeOSDs stops every OSD with SIGSTOP (a Ceph that stalls: I/O waits,
// nothing fails) and returns thaw, which sends SIGCONT; call it in every
// case (it does nothing the second time).
func (c *Cluster) FreezeOSDs() (thaw func(), err error) {
	var pids []int
	for i := 0; ; i++ {
		raw, err := os.ReadFile(filepath.Join(c.dir, "pids", fmt.Sprintf("osd.%d.pid", i)))
		if errors.Is(err, os.ErrNotExist) && i > 0 {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("pid of osd.%d: %w", i, err)
		}
		// The pid file's first line is the PID (then the command).
		first, _, _ := strings.Cut(string(raw), "\n")
		pid, err := strconv.Atoi(strings.TrimSpace(first))
		if err != nil {
			return nil, fmt.Errorf("pid file of osd.%d: %w", i, err)
		}
		pids = append(pids, pid)
	}
	signal := func(sig unix.Signal) error {
		var errs []error
		for _, pid := range pids {
			if err := unix.Kill(pid, sig); err != nil {
				errs = append(errs, fmt.Errorf("signal osd pid %d: %w", pid, err))
			}
		}
		return errors.Join(errs...)
	}
	var once sync.Once
	thaw = func() { once.Do(func() { _ = signal(unix.SIGCONT) }) }
	if err := signal(unix.SIGSTOP); err != nil {
		thaw()
		return nil, err
	}
	return thaw, nil
}

// WaitHealthy starts any daemon that is not running and waits until every
// placement group is active+clean again (recovery after an OSD came back).
func (c *Cluster) WaitHealthy(ctx context.Context) error {
	_, err := c.script(ctx, upTimeout, "up.sh")
	return err
}

// RBD runs the rbd command as the berth client (its caps, not admin's).
func (c *Cluster) RBD(ctx context.Context, args ...string) ([]byte, error) {
	return c.run(ctx, "rbd", append([]string{"-c", c.Conf, "--id", c.Client, "--keyring", c.Keyring}, args...)...)
}

// Ceph runs the ceph command as the berth client.
func (c *Cluster) Ceph(ctx context.Context, args ...string) ([]byte, error) {
	return c.run(ctx, "ceph", append([]string{"-c", c.Conf, "--id", c.Client, "--keyring", c.Keyring, "--connect-timeout", "30"}, args...)...)
}

// NodeCeph runs the ceph command as the nodes' client (its caps).
func (c *Cluster) NodeCeph(ctx context.Context, args ...string) ([]byte, error) {
	return c.run(ctx, "ceph", append([]string{"-c", c.Conf, "--id", c.NodeClient, "--keyring", c.NodeKeyring, "--connect-timeout", "30"}, args...)...)
}

// AdminCeph runs the ceph command as client.admin.
func (c *Cluster) AdminCeph(ctx context.Context, args ...string) ([]byte, error) {
	return c.run(ctx, "ceph", append([]string{"-c", c.AdminConf, "-n", "client.admin", "--connect-timeout", "30"}, args...)...)
}

// cmdTimeout bounds one rbd or ceph command when ctx has no deadline.
const cmdTimeout = 2 * time.Minute

func (c *Cluster) run(ctx context.Context, name string, args ...string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, cmdTimeout)
	defer cancel()
	if c.netns != "" {
		// The monitors are reachable inside the namespace only.
		name, args = "ip", append([]string{"netns", "exec", c.netns, name}, args...)
	}
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.Bytes(), fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, bytes.TrimSpace(stderr.Bytes()))
	}
	return stdout.Bytes(), nil
}

func (c *Cluster) script(ctx context.Context, timeout time.Duration, name string, args ...string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, filepath.Join(c.scripts, name), args...)
	cmd.Env = c.env
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	// The daemons keep no pipe of ours (their output goes to their logs),
	// so Wait returns when the script does.
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("hack/ceph/%s %s: %w\n%s", name, strings.Join(args, " "), err, tail(stderr.String(), 30))
	}
	return stdout.Bytes(), nil
}

// ClientKey reads the berth client's secret from its keyring (for a
// Secret or a ceph.Config; never log it).
func (c *Cluster) ClientKey() (string, error) { return keyringKey(c.Keyring) }

// NodeClientKey reads the nodes' client's secret (the node-stage secret's).
func (c *Cluster) NodeClientKey() (string, error) { return keyringKey(c.NodeKeyring) }

func keyringKey(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	for _, l := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(strings.TrimSpace(l), "="); ok && strings.TrimSpace(k) == "key" {
			return strings.TrimSpace(v), nil
		}
	}
	return "", fmt.Errorf("no key in %s", path)
}

// readEnv reads up.sh's env file (KEY=VALUE lines).
func (c *Cluster) readEnv(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("hack/ceph/up.sh env file: %w", err)
	}
	defer func() { _ = f.Close() }()
	fields := map[string]*string{
		"BERTH_CEPH_MON_HOST":      &c.MonHost,
		"BERTH_CEPH_MONITORS":      &c.Monitors,
		"BERTH_CEPH_POOL":          &c.Pool,
		"BERTH_CEPH_CLIENT":        &c.Client,
		"BERTH_CEPH_KEYRING":       &c.Keyring,
		"BERTH_CEPH_NODE_CLIENT":   &c.NodeClient,
		"BERTH_CEPH_NODE_KEYRING":  &c.NodeKeyring,
		"BERTH_CEPH_CONF":          &c.Conf,
		"BERTH_CEPH_ADMIN_KEYRING": &c.AdminKeyring,
		"BERTH_CEPH_ADMIN_CONF":    &c.AdminConf,
	}
	s := bufio.NewScanner(f)
	for s.Scan() {
		k, v, ok := strings.Cut(s.Text(), "=")
		if p := fields[k]; ok && p != nil {
			*p = v
		}
	}
	if err := s.Err(); err != nil {
		return fmt.Errorf("read %s: %w", path, err)
	}
	for k, p := range fields {
		if *p == "" {
			return fmt.Errorf("%s: %s missing", path, k)
		}
	}
	return nil
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
