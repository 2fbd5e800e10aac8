package share

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// killStale kills a ganesha left by an earlier share manager with the same
// Dir (its pid file names it), which would hold the port and the files.
func (s *Server) killStale() {
	b, err := os.ReadFile(s.cfg.PidFile())
	if err != nil {
		return
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 1 {
		return
	}
	comm, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
	if err != nil || !strings.HasPrefix(strings.TrimSpace(string(comm)), "ganesha") {
		return
	}
	s.log.Info("killing a ganesha left from an earlier start", "pid", pid)
	_ = syscall.Kill(pid, syscall.SIGKILL)
	for i := 0; i < 50; i++ {
		if _, err := os.Stat(fmt.Sprintf("/proc/%d", pid)); err != nil {
			return
		}
		s.clk.Sleep(20 * time.Millisecond)
	}
}
