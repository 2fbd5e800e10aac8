package testceph

import (
	"context"
	"fmt"
	"os"
	"sync"
	"testing"
)

// Lazy is a test Ceph started by the first test that asks for it, for
// packages whose other tests do not need one.
type Lazy struct {
	// Name tags the start-up time line on stderr; Options place the cluster.
	Name    string
	Options Options
	// AtEnd registers the stop, to run once every test is done.
	AtEnd func(stop func())

	once sync.Once
	c    *Cluster
	skip string
	err  error
}

// Get returns the running cluster, starting it on first use; it skips t
// where a test Ceph cannot run and fails it when the start failed.
func (l *Lazy) Get(t testing.TB) *Cluster {
	t.Helper()
	l.once.Do(func() {
		if l.skip = SkipReason(context.Background()); l.skip != "" {
			return
		}
		l.c = New(l.Options)
		l.AtEnd(func() {
			if err := l.c.Stop(context.Background()); err != nil {
				fmt.Fprintln(os.Stderr, "stop test Ceph:", err)
			}
		})
		l.err = l.c.upTimed(l.Name)
	})
	if l.skip != "" {
		t.Skip(l.skip)
	}
	if l.err != nil {
		t.Fatal(l.err)
	}
	return l.c
}
