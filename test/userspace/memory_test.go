package userspace

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/berth-io/berth/internal/keeper"
)

// serverMemory is what /proc tells of one process's memory, in bytes.
// rss counts every resident page; anon those of the process alone (heap,
// stacks); pss splits each shared page (the binary, librados and librbd)
// among the processes that map it: with many servers, close to what one
// more server costs the node.
type serverMemory struct {
	rss, anon, pss int64
	threads        int
}

// readServerMemory reads /proc/<pid>/status and smaps_rollup.
func readServerMemory(pid int) (serverMemory, error) {
	var m serverMemory
	kib := map[string]*int64{"VmRSS:": &m.rss, "RssAnon:": &m.anon}
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return m, err
	}
	rollup, err := os.ReadFile(fmt.Sprintf("/proc/%d/smaps_rollup", pid))
	if err != nil {
		return m, err
	}
	kib["Pss:"] = &m.pss
	for _, b := range [][]byte{status, rollup} {
		sc := bufio.NewScanner(bytes.NewReader(b))
		for sc.Scan() {
			f := strings.Fields(sc.Text())
			if len(f) < 2 {
				continue
			}
			if f[0] == "Threads:" {
				m.threads, err = strconv.Atoi(f[1])
			} else if p, ok := kib[f[0]]; ok {
				*p, err = strconv.ParseInt(f[1], 10, 64)
				*p <<= 10
			}
			if err != nil {
				return m, fmt.Errorf("/proc/%d: %q: %w", pid, sc.Text(), err)
			}
		}
	}
	if m.rss == 0 || m.pss == 0 || m.threads == 0 {
		return m, fmt.Errorf("/proc/%d: no VmRSS, Pss or Threads", pid)
	}
	return m, nil
}

// reportIdleServers lets the servers of volumes settle, then prints one
// SERVER_MEMORY_RESULT line for hack/bench.sh: the median server's
// figures (MiB; each column's own median). BENCH_MEMORY_SETTLE: seconds
// to settle (default 5).
func (f *fixture) reportIdleServers(t *testing.T, kind string, volumes []string) {
	t.Helper()
	// Past the start's allocations and the first health checks.
	time.Sleep(time.Duration(envInt("BENCH_MEMORY_SETTLE", 5)) * time.Second)
	list, err := keeper.NewClient(f.keeperSock).List(context.Background())
	if err != nil {
		t.Fatalf("keeper list: %v", err)
	}
	var rss, anon, pss, threads []float64
	for _, v := range list {
		if !slices.Contains(volumes, v.Name) || v.ServerPID == 0 {
			continue
		}
		m, err := readServerMemory(v.ServerPID)
		if err != nil {
			t.Fatalf("server of %s: %v", v.Name, err)
		}
		rss, anon, pss = append(rss, mib(m.rss)), append(anon, mib(m.anon)), append(pss, mib(m.pss))
		threads = append(threads, float64(m.threads))
	}
	if len(rss) != len(volumes) {
		t.Fatalf("%d servers for %d volumes (keeper: %+v)", len(rss), len(volumes), list)
	}
	fmt.Printf("SERVER_MEMORY_RESULT kind=%s servers=%d rss=%.1fMiB anon=%.1fMiB pss=%.1fMiB threads=%.0f\n",
		kind, len(rss), median(rss), median(anon), median(pss), median(threads))
}

func mib(b int64) float64 { return float64(b) / (1 << 20) }

func median(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	return s[len(s)/2]
}

// TestIdleServerMemory is `make bench`'s memory row for local userspace
// volumes, not a test: BENCH_MEMORY_VOLUMES (default 10) volumes staged
// and published, idle; it asserts nothing about the figures. Runs only
// with BERTH_MEMORY_BENCH=1.
func TestIdleServerMemory(t *testing.T) {
	if os.Getenv("BERTH_MEMORY_BENCH") != "1" {
		t.Skip("a benchmark: BERTH_MEMORY_BENCH=1 (make bench) runs it")
	}
	f := setup(t)
	nc := f.node(t)
	names := make([]string, envInt("BENCH_MEMORY_VOLUMES", 10))
	for i := range names {
		names[i] = fmt.Sprintf("memory-%d", i)
		f.userspaceVolume(t, nc, names[i])
	}
	f.reportIdleServers(t, "local", names)
}
