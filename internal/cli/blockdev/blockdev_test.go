package blockdev

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	"golang.org/x/sys/unix"

	"github.com/berth-io/berth/internal/blockdev/ublk"
	"github.com/berth-io/berth/internal/cli"
	"github.com/berth-io/berth/internal/nbd"
)

func TestRefusesBadFlagCombinations(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--transport", "iscsi", "--volume", "v", "--image", "/i"}, `--transport "iscsi": want fuse, nbd or ublk`},
		{[]string{"--transport", "nbd", "--volume", "v", "--image", "/i", "--ublk-recover", "3"}, "--ublk-recover not used with --transport nbd"},
		{[]string{"--transport", "ublk", "--volume", "v", "--image", "/i", "--connections", "3", "--mountpoint", "/m"}, "--connections, --mountpoint not used with --transport ublk"},
		{[]string{"--transport", "ublk", "--volume", "v", "--image", "/i", "--ublk-recover", "-1"}, "want a ublk device number"},
		{[]string{"--volume", "v", "--image", "/i", "--mountpoint", "/m", "--node", "n"}, "--node not used with --transport fuse"},
		{[]string{"--transport", "nbd", "--volume", "v", "--image", "/i", "--mountpoint", "/m", "--passthrough"}, "--mountpoint, --passthrough not used with --transport nbd"},
		{[]string{"--volume", "v", "--image", "/i", "--mountpoint", "/m", "--connections", "3"}, "--connections not used with --transport fuse"},
		{[]string{"--transport", "fuse", "--volume", "v", "--image", "/i", "--dead-conn-timeout", "1m"}, "--dead-conn-timeout not used with --transport fuse"},
	} {
		var stderr bytes.Buffer
		err := Command().Main(context.Background(), c.args, cli.IO{Stderr: &stderr, Stdout: &stderr})
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Fatalf("%v: error %v, want %q", c.args, err, c.want)
		}
	}
}

func TestNBDWithoutKernelSupport(t *testing.T) {
	err := Config{Transport: "nbd", Volume: "v", Image: "/i", Sysfs: t.TempDir(), Log: testr.New(t)}.Run(context.Background())
	if err == nil || !strings.Contains(err.Error(), "module/nbd") || !strings.Contains(err.Error(), "modprobe nbd") {
		t.Fatalf("error %v: want the missing module and modprobe named", err)
	}
}

// readyPipe is a server's ready fd and the test's end of it (closed with
// the test). Run owns and closes the fd.
func readyPipe(t *testing.T) (*os.File, int) {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Close() })
	defer func() { _ = w.Close() }()
	fd, err := unix.Dup(int(w.Fd()))
	if err != nil {
		t.Fatal(err)
	}
	return r, fd
}

// TestUblkWithoutKernelSupport: on a kernel without ublk (this machine's)
// the server says what the node lacks, on its ready line too, so that the
// agent's stage fails with it.
func TestUblkWithoutKernelSupport(t *testing.T) {
	r, readyFD := readyPipe(t)
	err := Config{Transport: "ublk", Volume: "v", Image: "/i", Dev: t.TempDir(), ReadyFD: readyFD, Log: testr.New(t)}.Run(context.Background())
	if !errors.Is(err, ublk.ErrNoUblk) || !strings.Contains(err.Error(), "CONFIG_BLK_DEV_UBLK") {
		t.Fatalf("error %v: want ErrNoUblk naming the kernel feature", err)
	}
	line, _ := bufio.NewReader(r).ReadString('\n')
	if !strings.HasPrefix(line, "error ") || !strings.Contains(line, "CONFIG_BLK_DEV_UBLK") {
		t.Errorf("ready line %q: want the reason", line)
	}
}

// heldKernel is a stand-in nbd driver: it connects device 0 and keeps its
// own copies of the sockets, as the kernel does.
type heldKernel struct {
	mu    sync.Mutex
	socks []*os.File
}

func (k *heldKernel) Connect(p nbd.ConnectParams) (int, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	for _, s := range p.Socks {
		fd, err := unix.Dup(int(s.Fd()))
		if err != nil {
			return 0, err
		}
		k.socks = append(k.socks, os.NewFile(uintptr(fd), "kernel"))
	}
	return 0, nil
}
func (k *heldKernel) Reconfigure(int, string, []*os.File, time.Duration) error { return unix.EINVAL }
func (k *heldKernel) Disconnect(int) error                                     { return nil }
func (k *heldKernel) Status(int) (bool, error)                                 { return false, nil }

func (k *heldKernel) close() {
	k.mu.Lock()
	defer k.mu.Unlock()
	for _, s := range k.socks {
		_ = s.Close()
	}
}

func TestNBDReadyLine(t *testing.T) {
	sysfs := t.TempDir()
	if err := os.MkdirAll(filepath.Join(sysfs, "module", "nbd"), 0o755); err != nil {
		t.Fatal(err)
	}
	image := filepath.Join(t.TempDir(), "disk.img")
	if err := os.WriteFile(image, make([]byte, 1<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	r, readyFD := readyPipe(t)
	k := &heldKernel{}
	defer k.close()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- Config{Transport: "nbd", Volume: "v", Image: image, Sysfs: sysfs, Kernel: k,
			ReadyFD: readyFD, Log: testr.New(t)}.Run(ctx)
	}()
	line, err := bufio.NewReader(r).ReadString('\n')
	if err != nil || line != "ready /dev/nbd0\n" {
		t.Fatalf("ready line %q, %v", line, err)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run after its context ended: %v", err)
	}
	if len(k.socks) != 2 {
		t.Fatalf("%d sockets, want the 2 default connections", len(k.socks))
	}
}
