package blockdev

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/berth-io/berth/internal/atomicfile"
)

// IOErrors counts a volume's requests answered with an I/O error (the
// image's read, write, sync or fallocate failed) in a file that outlives
// its server: a server started again for the same staging goes on from
// the count so far, and the agent sums the files of its node
// (berth_blockdev_io_errors_total). Add is an atomic add, on the error
// path only; Run writes the file at most once per interval. Nil-safe.
type IOErrors struct {
	path    string
	n       atomic.Uint64
	written uint64
}

// OpenIOErrors counts from what path holds (nothing: 0).
func OpenIOErrors(path string) (*IOErrors, error) {
	n, err := ReadIOErrors(path)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, err
	}
	e := &IOErrors{path: path, written: n}
	e.n.Store(n)
	return e, nil
}

// ReadIOErrors reads a count IOErrors wrote.
func ReadIOErrors(path string) (uint64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	n, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("I/O error count %s: %w", path, err)
	}
	return n, nil
}

// Add counts one request answered with an error.
func (e *IOErrors) Add() {
	if e != nil {
		e.n.Add(1)
	}
}

// Count is the count so far.
func (e *IOErrors) Count() uint64 {
	if e == nil {
		return 0
	}
	return e.n.Load()
}

// Run writes the count every interval while it changes, until ctx ends,
// and once more then.
func (e *IOErrors) Run(ctx context.Context, interval time.Duration) error {
	if e == nil {
		return nil
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return e.flush()
		case <-t.C:
			if err := e.flush(); err != nil {
				return err
			}
		}
	}
}

// flush writes the count when it changed since the last write (one
// goroutine only: Run's).
func (e *IOErrors) flush() error {
	n := e.n.Load()
	if n == e.written {
		return nil
	}
	if err := atomicfile.Write(e.path, []byte(strconv.FormatUint(n, 10)+"\n"), 0o600); err != nil {
		return fmt.Errorf("write I/O error count: %w", err)
	}
	e.written = n
	return nil
}
