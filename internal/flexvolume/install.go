package flexvolume

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
)

// SocketFile is the file beside the installed driver that names the agent
// socket: the agent writes it when it installs the driver (kubelet passes
// the driver no flags).
const SocketFile = "agent-socket"

// DefaultSocket is the agent socket when nothing else names it.
const DefaultSocket = "/run/berth/agent.sock"

// ReadyMessage starts the driver's init message when the agent answered;
// the agent checks for it after installing the driver.
const ReadyMessage = "agent ready"

// StaticBinary is the file name, beside the berth binary, of berth built
// static without the ceph backend (`make build` makes both): kubelet runs
// the installed driver on the host, which may lack the Ceph libraries the
// default build links, and the driver needs none of them.
const StaticBinary = "berth-flexvolume"

// DriverBinary is the binary to install as the driver for the berth binary
// self: its static build beside it (StaticBinary) when there is one, else
// self.
func DriverBinary(self string) string {
	static := filepath.Join(filepath.Dir(self), StaticBinary)
	if fi, err := os.Stat(static); err == nil && fi.Mode().IsRegular() {
		return static
	}
	return self
}

// Install copies binary into <pluginDir>/berth.io~berth/berth, where kubelet
// looks for the driver, and writes extra files beside it (name → content).
// Each file is written to a temporary name and renamed, so kubelet never
// runs a half-written driver. It returns the installed driver's path.
func Install(pluginDir, binary string, extra map[string]string) (string, error) {
	dir := filepath.Join(pluginDir, Dir)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("driver folder: %w", err)
	}
	for name, content := range extra {
		if err := writeAtomic(dir, name, 0o644, func(w io.Writer) error {
			_, err := io.WriteString(w, content)
			return err
		}); err != nil {
			return "", err
		}
	}
	src, err := os.Open(binary)
	if err != nil {
		return "", fmt.Errorf("open %s: %w", binary, err)
	}
	defer func() { _ = src.Close() }()
	if err := writeAtomic(dir, Name, 0o755, func(w io.Writer) error {
		_, err := io.Copy(w, src)
		return err
	}); err != nil {
		return "", err
	}
	return filepath.Join(dir, Name), nil
}

func writeAtomic(dir, name string, mode os.FileMode, fill func(io.Writer) error) error {
	tmp, err := os.CreateTemp(dir, "."+name+".tmp-*")
	if err != nil {
		return fmt.Errorf("install %s: %w", name, err)
	}
	defer func() { _ = os.Remove(tmp.Name()) }() // gone after the rename; cleans up on failure
	if err := fill(tmp); err != nil {
		_ = tmp.Close()
		return fmt.Errorf("install %s: %w", name, err)
	}
	if err := tmp.Chmod(mode); err != nil {
		_ = tmp.Close()
		return fmt.Errorf("install %s: %w", name, err)
	}
	if err := tmp.Sync(); err != nil {
		_ = tmp.Close()
		return fmt.Errorf("install %s: %w", name, err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("install %s: %w", name, err)
	}
	if err := os.Rename(tmp.Name(), filepath.Join(dir, name)); err != nil {
		return fmt.Errorf("install %s: %w", name, err)
	}
	return nil
}

// Remove deletes the installed driver's folder <pluginDir>/berth.io~berth
// (the driver and the files beside it); a folder already gone is no error.
// kubelet's plugin probe then forgets the driver.
func Remove(pluginDir string) error {
	if err := os.RemoveAll(filepath.Join(pluginDir, Dir)); err != nil {
		return fmt.Errorf("remove the driver: %w", err)
	}
	return nil
}

// MountsIn lists the Flexvolume mounts kubelet keeps for berth below its
// root: pods/<uid>/volumes/berth.io~berth/<volume>. While one is there,
// kubelet needs the driver to unmount it.
func MountsIn(kubeletDir string) ([]string, error) {
	m, err := filepath.Glob(filepath.Join(kubeletDir, "pods", "*", "volumes", Dir, "*"))
	if err != nil {
		return nil, fmt.Errorf("list berth's Flexvolume mounts: %w", err)
	}
	return m, nil
}
