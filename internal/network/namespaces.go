package network

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"

	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/berth-io/berth/internal/podcgroup"
)

// ErrHolderGone means no process is in a holder's recorded namespace any
// more: the pod is gone, and its interface with it.
var ErrHolderGone = errors.New("the holder's network namespace is gone")

// Namespaces opens the holders' network namespaces.
type Namespaces interface {
	// Open returns rtnetlink in r's namespace, or an error wrapping
	// ErrHolderGone.
	Open(r Record) (Stack, error)
}

// ProcNamespaces finds namespaces in a proc filesystem of the host's PID
// namespace (the mover runs with host PID). It takes a namespace only from
// a process of the record's own pod (kubelet's pod cgroup names the pod's
// UID): a record cannot point the mover at another pod's network (F19).
type ProcNamespaces struct {
	// Proc is where that proc is mounted: /proc.
	Proc string
	// AnyPod takes the namespace from any process in it, also one outside
	// kubelet's pod cgroups: for tests that run plain processes.
	AnyPod bool
}

// ofPod tells whether process pid (a /proc entry's name) is one of pod
// uid's.
func (p ProcNamespaces) ofPod(pid, uid string) bool {
	if p.AnyPod {
		return true
	}
	b, err := os.ReadFile(filepath.Join(p.Proc, pid, "cgroup"))
	return err == nil && podcgroup.PodUID(string(b)) == uid
}

// statNSID returns the identity of the namespace file at path.
func statNSID(path string) (NSID, error) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return NSID{}, err
	}
	return NSID{Dev: st.Dev, Ino: st.Ino}, nil
}

// find returns a /proc/<pid>/ns/net path of r's namespace: the recorded PID
// when it is in it, else the first process found in it; each of r's pod.
// A namespace that only other pods' processes are in is refused.
func (p ProcNamespaces) find(r Record) (string, error) {
	if r.PID > 0 {
		pid := strconv.Itoa(r.PID)
		path := filepath.Join(p.Proc, pid, "ns", "net")
		if id, err := statNSID(path); err == nil && id == r.NetNS && p.ofPod(pid, r.PodUID) {
			return path, nil
		}
	}
	entries, err := os.ReadDir(p.Proc)
	if err != nil {
		return "", fmt.Errorf("look for holder %s: %w", r.PodUID, err)
	}
	foreign := ""
	for _, e := range entries {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		path := filepath.Join(p.Proc, e.Name(), "ns", "net")
		// A process that exits meanwhile, or a kernel thread, fails stat: skip it.
		if id, err := statNSID(path); err != nil || id != r.NetNS {
			continue
		}
		if p.ofPod(e.Name(), r.PodUID) {
			return path, nil
		}
		foreign = e.Name()
	}
	if foreign != "" {
		return "", fmt.Errorf("holder %s (%s/%s): its recorded network namespace is that of process %s, which is not of pod %s: refused",
			r.PodUID, r.PodNamespace, r.PodName, foreign, r.PodUID)
	}
	return "", fmt.Errorf("holder %s (%s/%s): %w", r.PodUID, r.PodNamespace, r.PodName, ErrHolderGone)
}

// Handle opens r's namespace; the caller closes it.
func (p ProcNamespaces) Handle(r Record) (netns.NsHandle, error) {
	path, err := p.find(r)
	if err != nil {
		return netns.None(), err
	}
	ns, err := netns.GetFromPath(path)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) || errors.Is(err, unix.ESRCH) {
			// The process found exited between find and open: the next
			// round looks again rather than call the holder gone.
			return netns.None(), fmt.Errorf("holder %s: process %s exited while opening its namespace", r.PodUID, path)
		}
		return netns.None(), fmt.Errorf("holder %s: open %s: %w", r.PodUID, path, err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(int(ns), &st); err != nil {
		_ = ns.Close()
		return netns.None(), fmt.Errorf("holder %s: stat %s: %w", r.PodUID, path, err)
	}
	if (NSID{Dev: st.Dev, Ino: st.Ino}) != r.NetNS {
		_ = ns.Close()
		return netns.None(), fmt.Errorf("holder %s: %s changed namespace while opening it", r.PodUID, path)
	}
	return ns, nil
}

// Open returns rtnetlink in r's namespace.
func (p ProcNamespaces) Open(r Record) (Stack, error) {
	ns, err := p.Handle(r)
	if err != nil {
		return nil, err
	}
	// The netlink socket holds the namespace from here on.
	defer func() { _ = ns.Close() }()
	s, err := OpenStack(ns)
	if err != nil {
		return nil, fmt.Errorf("holder %s: %w", r.PodUID, err)
	}
	return s, nil
}

// SelfNSID returns the identity of this thread's network namespace.
func SelfNSID() (NSID, error) {
	return statNSID("/proc/thread-self/ns/net")
}
