package sharemanager

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"k8s.io/utils/clock"

	"github.com/berth-io/berth/internal/metrics"
)

// The liveness probe (--alive) reads a heartbeat that Run writes from its
// start to its end: while waiting for the device, for the old holder's
// Lease, through the NFS grace period and while serving. It is not the
// ready file on purpose: a share manager that waits for its device or is
// in grace is alive, and killing it (restartPolicy Never: the pod fails)
// would only start the next one over, with the wait and the grace again.
// Whether the share serves is the share manager's own check (it exits
// when ganesha, the device or the export fails); the heartbeat catches a
// process that no longer runs at all.
const (
	heartbeatInterval = 10 * time.Second
	// DefaultAliveWithin is how old the heartbeat may be: six beats.
	DefaultAliveWithin = 6 * heartbeatInterval
)

// AliveFile holds the unix time of the last heartbeat.
func (c Config) AliveFile() string { return filepath.Join(c.StateDir, "alive") }

// heartbeat writes AliveFile now and every heartbeatInterval until the
// returned stop is called.
func (c Config) heartbeat(ctx context.Context) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	beat := func() {
		err := os.MkdirAll(c.StateDir, 0o700)
		if err == nil {
			err = os.WriteFile(c.AliveFile(), []byte(strconv.FormatInt(c.Clock.Now().Unix(), 10)+"\n"), 0o644)
		}
		if err != nil {
			c.Log.Info("could not write the heartbeat", "err", err.Error())
		}
	}
	beat()
	go func() {
		defer close(done)
		tick := c.Clock.NewTicker(heartbeatInterval)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C():
				beat()
			}
		}
	}()
	return func() { cancel(); <-done; _ = os.Remove(c.AliveFile()) }
}

// checkAlive is the liveness probe (--alive): the heartbeat is at most
// AliveWithin old.
func (c Config) checkAlive() error {
	if c.Clock == nil {
		c.Clock = clock.RealClock{}
	}
	if c.AliveWithin == 0 {
		c.AliveWithin = DefaultAliveWithin
	}
	b, err := os.ReadFile(c.AliveFile())
	if err != nil {
		return fmt.Errorf("no heartbeat: %w", err)
	}
	sec, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	if err != nil {
		return fmt.Errorf("heartbeat %s: %w", c.AliveFile(), err)
	}
	if age := c.Clock.Since(time.Unix(sec, 0)); age > c.AliveWithin {
		return fmt.Errorf("last heartbeat %s ago, more than %s", age.Truncate(time.Second), c.AliveWithin)
	}
	return nil
}

// serveProbes serves checkAlive and checkReady over HTTP on HealthAddr
// until the returned stop is called. An exec probe starts the berth binary
// in the pod; on a busy slow node that took over 5 s, past the probe's
// timeout, and kept a serving share out of its Service.
func (c Config) serveProbes(ctx context.Context) (stop func(), err error) {
	l, err := metrics.Listen(c.HealthAddr)
	if err != nil || l == nil {
		return func() {}, err
	}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := metrics.Serve(ctx, l, metrics.ProbeHandler(c.checkAlive, c.checkReady)); err != nil {
			c.Log.Error(err, "probe endpoints stopped", "address", c.HealthAddr)
		}
	}()
	return func() { cancel(); <-done }, nil
}
