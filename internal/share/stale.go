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
	if !liveGanesha(pid) {
		return
	}
	s.log.Info("killing a ganesha left from an earlier start", "pid", pid)
	_ = syscall.Kill(pid, syscall.SIGKILL)
	for i := 0; i < 50 && liveGanesha(pid); i++ {
		s.clk.Sleep(20 * time.Millisecond)
	}
}

// liveGanesha tells whether pid is a ganesha that has not ended. A zombie
// (dead, not yet reaped: its parent died too) holds no port or file.
func liveGanesha(pid int) bool {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	// pid (comm) state ...; comm may hold spaces and parentheses.
	open, end := strings.IndexByte(string(stat), '('), strings.LastIndexByte(string(stat), ')')
	if open < 0 || end < open || end+3 > len(stat) {
		return false
	}
	comm, state := string(stat[open+1:end]), stat[end+2]
	return strings.HasPrefix(comm, "ganesha") && state != 'Z' && state != 'X'
}
