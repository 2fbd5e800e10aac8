package testceph

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/berth-io/berth/internal/testenv"
)

// Suite is a test binary's suite of this test Ceph alone (no API server),
// up before the first test and stopped after the last. Its Teardown runs
// also after a failed Up (up.sh may have started daemons); a daemon, port
// or file left behind fails the run. name tags the start-up time line.
func (c *Cluster) Suite(name string) *testenv.Suite {
	return &testenv.Suite{
		NoAPIServer: true,
		Skip:        func() string { return SkipReason(context.Background()) },
		Setup:       func(*testenv.Env) error { return c.upTimed(name) },
		Teardown:    func(bool) error { return c.Stop(context.Background()) },
	}
}

// upTimed brings the cluster up and says on stderr how long that took.
func (c *Cluster) upTimed(name string) error {
	start := time.Now()
	err := c.Up(context.Background())
	fmt.Fprintf(os.Stderr, "%s: test Ceph up in %s\n", name, time.Since(start).Round(100*time.Millisecond))
	return err
}
