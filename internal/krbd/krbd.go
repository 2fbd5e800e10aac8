// Package krbd maps Ceph RBD images with the kernel's rbd driver through
// its sysfs bus (the kernel's Documentation/ABI/testing/sysfs-bus-rbd), so
// the agent's image needs neither the rbd CLI nor udev: the kernel makes
// /dev/rbdN in devtmpfs.
package krbd

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Bus is the rbd bus of one kernel.
type Bus struct {
	// Root is the bus folder; "" is /sys/bus/rbd.
	Root string
	// Dev is the folder of the device nodes; "" is /dev.
	Dev string
	// Block is the kernel's folder of block devices; "" is /sys/block.
	Block string
}

func (b Bus) root() string {
	if b.Root == "" {
		return "/sys/bus/rbd"
	}
	return b.Root
}

// ErrNoDriver: this kernel has no rbd driver loaded.
var ErrNoDriver = errors.New("the kernel's rbd driver is not loaded")

// Available tells whether the kernel has the rbd driver.
func (b Bus) Available() error {
	if _, err := os.Stat(b.root()); errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("%w (%s is missing; modprobe rbd)", ErrNoDriver, b.root())
	} else if err != nil {
		return fmt.Errorf("look for the kernel's rbd driver: %w", err)
	}
	return nil
}

// Spec is one mapping to make.
type Spec struct {
	// Monitors in the form MonHost gives ("[v2:IP:PORT],[v1:IP:PORT]").
	Monitors string
	// Client is the cephx id without "client."; Key its secret.
	Client, Key string
	Pool, Image string
	// ReadOnly maps the image read-only.
	ReadOnly bool
	// Exclusive takes the image's exclusive lock at map time and never
	// hands it over (option exclusive): a second writer is refused while
	// this one lives, and so is every client's resize and snapshot, which
	// the kernel does not run for others. Without it the kernel takes the
	// lock at its first write and hands it over when asked.
	Exclusive bool
	// Timeout bounds the kernel's wait for the monitors and the OSD map
	// (mount_timeout; with Exclusive also for the lock, lock_timeout);
	// 0 is DefaultTimeout.
	Timeout time.Duration
}

// DefaultTimeout bounds a map when Spec names none.
const DefaultTimeout = 30 * time.Second

// options are the kernel's map options. Each mapping gets its own Ceph
// client (noshare): lock breaking blocklists one volume's client, never
// the node's other volumes of the same cluster.
func (s Spec) options(msMode string) string {
	t := s.Timeout
	if t <= 0 {
		t = DefaultTimeout
	}
	secs := strconv.Itoa(int((t + time.Second - 1) / time.Second))
	opts := []string{"name=" + s.Client, "secret=" + s.Key}
	if msMode != "" {
		opts = append(opts, "ms_mode="+msMode)
	}
	opts = append(opts, "mount_timeout="+secs, "noshare")
	if s.ReadOnly {
		opts = append(opts, "read_only")
	} else if s.Exclusive {
		opts = append(opts, "exclusive", "lock_timeout="+secs)
	}
	return strings.Join(opts, ",")
}

// kernelMonitors turns MonHost's list into the kernel's: "IP:PORT,..."
// and the messenger mode. The kernel speaks one protocol per mapping: v2
// monitors when there are any (ms_mode=prefer-crc, kernels from 5.11),
// else v1 with no ms_mode (older kernels refuse the option).
func kernelMonitors(monHost string) (addrs, msMode string, err error) {
	var v1, v2 []string
	for _, m := range strings.Split(monHost, ",") {
		m = strings.TrimSuffix(strings.TrimPrefix(strings.TrimSpace(m), "["), "]")
		proto, addr, ok := strings.Cut(m, ":")
		if !ok || (proto != "v1" && proto != "v2") {
			return "", "", fmt.Errorf("monitor %q: want [v1:|v2:]IP:PORT", m)
		}
		ap, err := netip.ParseAddrPort(addr)
		if err != nil {
			return "", "", fmt.Errorf("monitor %q: want an IP address and port: %w", m, err)
		}
		a := net.JoinHostPort(ap.Addr().String(), strconv.Itoa(int(ap.Port())))
		if proto == "v2" {
			v2 = append(v2, a)
		} else {
			v1 = append(v1, a)
		}
	}
	if len(v2) > 0 {
		return strings.Join(v2, ","), "prefer-crc", nil
	}
	return strings.Join(v1, ","), "", nil
}

// check refuses what the kernel's parser would split wrongly: its fields
// are separated by spaces, its options by commas.
func (s Spec) check() error {
	for _, f := range []struct{ name, value, bad string }{
		{"client", s.Client, " ,=\n\t"},
		// base64: '=', '/' and '+' are its own.
		{"key", s.Key, " ,\n\t"},
		{"pool", s.Pool, " ,=/@\n\t"},
		{"image", s.Image, " ,=/@\n\t"},
	} {
		if f.value == "" || strings.ContainsAny(f.value, f.bad) {
			return fmt.Errorf("rbd map: the %s is empty or has a character the kernel's rbd bus cannot take", f.name)
		}
	}
	return nil
}

// Device is one mapping of the kernel.
type Device struct {
	ID          int
	Pool, Image string
}

// Path is the device's node.
func (b Bus) Path(d Device) string {
	dev := b.Dev
	if dev == "" {
		dev = "/dev"
	}
	return filepath.Join(dev, "rbd"+strconv.Itoa(d.ID))
}

// ID is the device number of path (/dev/rbdN); ok is false for another
// path.
func (b Bus) ID(path string) (id int, ok bool) {
	dev := b.Dev
	if dev == "" {
		dev = "/dev"
	}
	n, found := strings.CutPrefix(path, filepath.Join(dev, "rbd"))
	id, err := strconv.Atoi(n)
	if !found || err != nil || strconv.Itoa(id) != n || id < 0 {
		return 0, false
	}
	return id, true
}

// Map maps the image and returns its device. The kernel write blocks
// until the monitors answered and the lock was taken, bounded by the
// spec's timeout; ctx ends the wait for it sooner, not the kernel's.
func (b Bus) Map(ctx context.Context, s Spec) (Device, error) {
	if err := s.check(); err != nil {
		return Device{}, err
	}
	mons, msMode, err := kernelMonitors(s.Monitors)
	if err != nil {
		return Device{}, err
	}
	before, err := b.List()
	if err != nil {
		return Device{}, err
	}
	add := filepath.Join(b.root(), "add_single_major")
	if _, err := os.Stat(add); err != nil {
		add = filepath.Join(b.root(), "add")
	}
	line := strings.Join([]string{mons, s.options(msMode), s.Pool, s.Image, "-"}, " ")
	if err := writeWithin(ctx, add, line); err != nil {
		// Never the line: it holds the key.
		return Device{}, fmt.Errorf("rbd map %s/%s (monitors %s): %w", s.Pool, s.Image, mons, mapCause(err))
	}
	after, err := b.List()
	if err != nil {
		return Device{}, err
	}
	for _, d := range after {
		if d.Pool == s.Pool && d.Image == s.Image && !slices.ContainsFunc(before, func(b Device) bool { return b.ID == d.ID }) {
			return d, nil
		}
	}
	return Device{}, fmt.Errorf("rbd map %s/%s: the kernel took the request, but no new device of it is on %s: %w", s.Pool, s.Image, b.root(), ErrPending)
}

// The kernel's answers to a map that callers tell apart.
var (
	// ErrLocked: another client holds the image's exclusive lock.
	ErrLocked = errors.New("another client holds the image's lock")
	// ErrRefused: the monitors refused the client or its key.
	ErrRefused = errors.New("the monitors refused the client")
	// ErrUnreachable: no monitor answered within the timeout.
	ErrUnreachable = errors.New("no monitor answered")
	// ErrNoImage: the pool or the image does not exist.
	ErrNoImage = errors.New("no such pool or image")
	// ErrPending: whether the kernel made the device is not known: it had
	// not answered when the caller's context ended, and may still make it
	// (an OSD that does not answer holds the map's header read, which
	// mount_timeout does not bound); or it answered, but no new device of
	// the image was found.
	ErrPending = errors.New("the kernel did not answer in time and may still do it")
)

func mapCause(err error) error {
	var errno syscall.Errno
	if !errors.As(err, &errno) {
		return err
	}
	switch errno {
	case syscall.EROFS, syscall.EBUSY:
		return fmt.Errorf("%w: %w", ErrLocked, err)
	case syscall.EACCES, syscall.EPERM, syscall.EKEYREJECTED:
		return fmt.Errorf("%w: %w", ErrRefused, err)
	case syscall.ETIMEDOUT:
		return fmt.Errorf("%w: %w", ErrUnreachable, err)
	case syscall.ENOENT:
		return fmt.Errorf("%w: %w", ErrNoImage, err)
	}
	return err
}

// writeWithin writes line to a bus file, waiting at most until ctx ends.
// The kernel's own timeouts end a write that outlives ctx.
func writeWithin(ctx context.Context, path, line string) error {
	done := make(chan error, 1)
	go func() {
		f, err := os.OpenFile(path, os.O_WRONLY, 0)
		if err != nil {
			done <- err
			return
		}
		_, err = f.WriteString(line)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		done <- err
	}()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return fmt.Errorf("%w: %w", ErrPending, ctx.Err())
	}
}

// List returns the kernel's mappings (of images; snapshots are skipped).
func (b Bus) List() ([]Device, error) {
	dirs, err := filepath.Glob(filepath.Join(b.root(), "devices", "*"))
	if err != nil {
		return nil, fmt.Errorf("list rbd devices: %w", err)
	}
	var out []Device
	for _, dir := range dirs {
		name := filepath.Base(dir)
		id, err := strconv.Atoi(name)
		if err != nil || strconv.Itoa(id) != name || id < 0 {
			continue
		}
		d, ok, err := readDevice(dir, id)
		if err != nil {
			return nil, err
		}
		if ok {
			out = append(out, d)
		}
	}
	return out, nil
}

// readDevice reads one device folder; ok is false for a device that went
// while it was read, or a snapshot's.
func readDevice(dir string, id int) (Device, bool, error) {
	d := Device{ID: id}
	for _, f := range []struct {
		name string
		to   *string
	}{{"pool", &d.Pool}, {"name", &d.Image}} {
		v, err := readAttr(dir, f.name)
		if errors.Is(err, fs.ErrNotExist) {
			return Device{}, false, nil
		} else if err != nil {
			return Device{}, false, err
		}
		*f.to = v
	}
	snap, err := readAttr(dir, "current_snap")
	if err == nil && snap != "-" {
		return Device{}, false, nil
	}
	return d, true, nil
}

func readAttr(dir, name string) (string, error) {
	b, err := os.ReadFile(filepath.Join(dir, name))
	if err != nil {
		return "", fmt.Errorf("rbd device %s: %w", filepath.Base(dir), err)
	}
	return strings.TrimRight(string(b), "\n"), nil
}

// Get returns mapping id when it is still the image's.
func (b Bus) Get(id int, pool, image string) (Device, bool, error) {
	d, ok, err := readDevice(filepath.Join(b.root(), "devices", strconv.Itoa(id)), id)
	if err != nil || !ok || d.Pool != pool || d.Image != image {
		return Device{}, false, err
	}
	return d, true, nil
}

// Find returns the mappings of pool/image.
func (b Bus) Find(pool, image string) ([]Device, error) {
	all, err := b.List()
	if err != nil {
		return nil, err
	}
	var out []Device
	for _, d := range all {
		if d.Pool == pool && d.Image == image {
			out = append(out, d)
		}
	}
	return out, nil
}

// ReadOnly tells whether the kernel maps d read-only: the block device's
// own flag, as the rbd bus shows no options but with the key.
func (b Bus) ReadOnly(d Device) (bool, error) {
	block := b.Block
	if block == "" {
		block = "/sys/block"
	}
	v, err := readAttr(filepath.Join(block, "rbd"+strconv.Itoa(d.ID)), "ro")
	switch v {
	case "0":
		return false, nil
	case "1":
		return true, nil
	}
	if err != nil {
		return false, err
	}
	return false, fmt.Errorf("rbd device %d: read-only flag %q: want 0 or 1", d.ID, v)
}

// ClientAddr is the address of the mapping's own Ceph client
// ("IP:PORT/NONCE"): what the blocklist takes to fence exactly it.
func (b Bus) ClientAddr(d Device) (string, error) {
	s, err := readAttr(filepath.Join(b.root(), "devices", strconv.Itoa(d.ID)), "client_addr")
	if err != nil {
		return "", err
	}
	ap, nonce, ok := strings.Cut(s, "/")
	if _, perr := netip.ParseAddrPort(ap); !ok || perr != nil {
		return "", fmt.Errorf("rbd device %d: client address %q: want IP:PORT/NONCE", d.ID, s)
	}
	if _, err := strconv.ParseUint(nonce, 10, 32); err != nil {
		return "", fmt.Errorf("rbd device %d: client address %q: want IP:PORT/NONCE", d.ID, s)
	}
	return s, nil
}

// Refresh makes the kernel read the image's header again (its new size
// after a resize) now, rather than at the next watch notification.
func (b Bus) Refresh(ctx context.Context, d Device) error {
	err := writeWithin(ctx, filepath.Join(b.root(), "devices", strconv.Itoa(d.ID), "refresh"), "1")
	if err != nil {
		return fmt.Errorf("rbd device %d: refresh: %w", d.ID, err)
	}
	return nil
}

// ErrBusy: the device is open (mounted or held by a process).
var ErrBusy = errors.New("device is open")

// Unmap removes the mapping; an open device is refused (ErrBusy), never
// forced. A mapping already gone is no error.
func (b Bus) Unmap(ctx context.Context, d Device) error {
	remove := filepath.Join(b.root(), "remove_single_major")
	if _, err := os.Stat(remove); err != nil {
		remove = filepath.Join(b.root(), "remove")
	}
	err := writeWithin(ctx, remove, strconv.Itoa(d.ID))
	switch {
	case err == nil, errors.Is(err, syscall.ENOENT):
		return nil
	case errors.Is(err, syscall.EBUSY):
		return fmt.Errorf("rbd unmap %s (%s/%s): %w: %w", b.Path(d), d.Pool, d.Image, ErrBusy, err)
	}
	return fmt.Errorf("rbd unmap %s (%s/%s): %w", b.Path(d), d.Pool, d.Image, err)
}
