package sanity

import (
	"context"
	"fmt"
	"path/filepath"
	"syscall"
	"time"

	"github.com/berth-io/berth/internal/keeper"
	"github.com/berth-io/berth/internal/testenv"
)

// userspace is what the agent needs for userspace volumes (the ceph
// class's mounter): berth built as `make build` builds it, which runs the
// blockdev servers, and a keeper process holding their FUSE connections.
type userspace struct {
	berth, socket string
	keeper        *testenv.Process
}

// startUserspace builds berth into dir and starts its keeper there.
func startUserspace(dir string) (*userspace, error) {
	berth, err := testenv.BuildBerth(dir)
	if err != nil {
		return nil, err
	}
	u := &userspace{berth: berth, socket: filepath.Join(dir, "keeper.sock")}
	log := filepath.Join(dir, "keeper.log")
	if u.keeper, err = testenv.StartProcess(log, berth, "keeper", "--socket", u.socket); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for keeper.NewClient(u.socket).Ping(ctx) != nil {
		if ctx.Err() != nil || u.keeper.Exited() {
			u.stop()
			return nil, fmt.Errorf("the keeper did not answer on %s (log: %s)", u.socket, log)
		}
		time.Sleep(50 * time.Millisecond)
	}
	return u, nil
}

// stop ends the keeper by its PID: SIGTERM, SIGKILL after 10 s.
func (u *userspace) stop() {
	if u != nil {
		u.keeper.Stop(syscall.SIGTERM, 10*time.Second)
	}
}
