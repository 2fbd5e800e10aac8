package testenv

import (
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	"golang.org/x/sys/unix"
)

// EMFILELog is a logger for a server under test that notes when the server
// logs running out of file descriptors.
type EMFILELog struct {
	seen atomic.Int32
}

// Logger returns the logger to give the server.
func (l *EMFILELog) Logger() logr.Logger {
	return funcr.New(func(_, args string) {
		if strings.Contains(args, "too many open files") {
			l.seen.Add(1)
		}
	}, funcr.Options{})
}

// Seen tells whether the server logged EMFILE.
func (l *EMFILELog) Seen() bool { return l.seen.Load() > 0 }

// OutOfFDs runs call, a client of a server in this process that opens one
// descriptor (its socket) and waits for the answer, while this process may
// open no descriptor after that one: the server's accept fails with
// EMFILE. Once log has seen that (or after 5s) the limit is restored, and
// OutOfFDs returns what call returned. The test fails if EMFILE never came.
func OutOfFDs(t testing.TB, log *EMFILELog, call func() error) error {
	t.Helper()
	var old unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &old); err != nil {
		t.Fatal(err)
	}
	free, err := unix.Open("/dev/null", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	_ = unix.Close(free)
	restore := func() {
		if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &old); err != nil {
			t.Fatal(err)
		}
	}
	if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &unix.Rlimit{Cur: uint64(free) + 1, Max: old.Max}); err != nil {
		t.Fatal(err)
	}
	answered := make(chan error, 1)
	go func() { answered <- call() }()
	for deadline := time.Now().Add(5 * time.Second); !log.Seen() && time.Now().Before(deadline); {
		time.Sleep(5 * time.Millisecond)
	}
	restore()
	if !log.Seen() {
		t.Error("accept never failed with EMFILE: the test did not run the server out of descriptors")
	}
	return <-answered
}
