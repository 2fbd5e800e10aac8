package testenv

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"testing"
)

// Suite is a package's shared test fixture: one real kube-apiserver + etcd
// (and whatever the package starts beside them), started once by Main
// before the package's tests and stopped after them. A test that needs it
// calls Require, which skips the test, saying why, where the fixture cannot
// run here.
type Suite struct {
	// Root: the tests need root (loop devices, mounts). Devices: device
	// nodes they need (root too).
	Root    bool
	Devices []string
	// NoAPIServer: the fixture is Setup alone (a test Ceph), no API server.
	NoAPIServer bool
	// Skip, when set, gives a further reason the fixture cannot run here
	// ("" when it can); it runs after the checks above pass.
	Skip func() string
	// Setup runs once the API server is up (env is nil with NoAPIServer):
	// the package's own processes, managers, objects.
	Setup func(env *Env) error
	// Teardown runs after the tests, before the API server stops, also when
	// Start or Setup failed half way; failed tells whether anything failed.
	// An error fails the run: something may be left behind.
	Teardown func(failed bool) error

	env  *Env
	skip string
}

// Main runs a package's tests around s and returns the exit code for
// os.Exit. Where the fixture cannot run (-short, no KUBEBUILDER_ASSETS, not
// root, a device missing, s.Skip) it says why on stderr and runs the tests,
// which skip themselves through Require: never a silent pass. Otherwise it
// starts the API server and s.Setup, runs the tests, then s.Teardown and
// stops the API server and etcd (by PID); a start or stop error fails the
// run.
func Main(m *testing.M, s *Suite) int {
	if !flag.Parsed() {
		flag.Parse()
	}
	if s.skip = s.skipReason(); s.skip != "" {
		fmt.Fprintln(os.Stderr, "testenv: the tests that need the shared fixture skip:", s.skip)
		return m.Run()
	}
	code := 1
	if err := s.start(); err != nil {
		fmt.Fprintln(os.Stderr, "testenv: start:", err)
	} else {
		code = m.Run()
	}
	if err := s.stop(code != 0); err != nil {
		fmt.Fprintln(os.Stderr, "testenv: stop:", err)
		code = 1
	}
	return code
}

// Require skips tb when the fixture does not run here and returns the API
// server (nil with NoAPIServer).
func (s *Suite) Require(tb testing.TB) *Env {
	tb.Helper()
	if s.skip != "" {
		tb.Skip(s.skip)
	}
	if s.env == nil && !s.NoAPIServer {
		tb.Fatal("testenv: no API server: the package's TestMain must run testenv.Main")
	}
	return s.env
}

// SkipReason is why the fixture does not run here, "" when it runs (valid
// once Main has started).
func (s *Suite) SkipReason() string { return s.skip }

func (s *Suite) skipReason() string {
	if testing.Short() {
		return "-short: needs a real API server, and for some tests root and kernel devices"
	}
	if s.Root || len(s.Devices) > 0 {
		if r := NodeSkipReason(s.Devices...); r != "" {
			return r
		}
	}
	if !s.NoAPIServer && os.Getenv("KUBEBUILDER_ASSETS") == "" {
		return "needs a real kube-apiserver + etcd: KUBEBUILDER_ASSETS is not set " +
			"(make test sets it; by hand: KUBEBUILDER_ASSETS=$(hack/kube-binaries.sh | tail -n1))"
	}
	if s.Skip != nil {
		return s.Skip()
	}
	return ""
}

func (s *Suite) start() error {
	if !s.NoAPIServer {
		dir := os.Getenv("KUBEBUILDER_ASSETS")
		for _, b := range []string{"kube-apiserver", "etcd"} {
			// A set but wrong KUBEBUILDER_ASSETS is a broken setup, not a
			// reason to skip.
			if _, err := os.Stat(filepath.Join(dir, b)); err != nil {
				return fmt.Errorf("KUBEBUILDER_ASSETS=%s has no %s (hack/kube-binaries.sh builds both): %w", dir, b, err)
			}
		}
		env, err := Start()
		if err != nil {
			return err
		}
		s.env = env
	}
	if s.Setup != nil {
		return s.Setup(s.env)
	}
	return nil
}

func (s *Suite) stop(failed bool) error {
	var errs []error
	if s.Teardown != nil {
		errs = append(errs, s.Teardown(failed))
	}
	if s.env != nil {
		if err := s.env.Stop(); err != nil {
			errs = append(errs, fmt.Errorf("stop kube-apiserver + etcd: %w", err))
		}
	}
	return errors.Join(errs...)
}
