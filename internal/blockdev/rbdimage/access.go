// Package rbdimage serves an RBD image through librbd (go-ceph) to the
// userspace block device servers. Only rbd.go needs the Ceph libraries (build
// tag ceph); without it Open refuses with ErrNotBuilt. This file, which
// the agent uses to hand a server its image, builds everywhere.
package rbdimage

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/berth-io/berth/internal/atomicfile"
)

// Prefix marks a server's --image as an RBD image: "rbd:" and the path of
// its access file. The key is in that file, never on a command line.
const Prefix = "rbd:"

// Spec is the --image of the RBD image whose access file is at path.
func Spec(path string) string { return Prefix + path }

// ErrNotBuilt: this berth binary was built without the ceph tag.
var ErrNotBuilt = errors.New("berth built without the ceph backend (build tag ceph): it cannot serve RBD images")

// Why a server cannot open its image, as its error says: a server is
// another process, so the agent tells them by their words (Cause).
var (
	// ErrRefused: the monitors refused the key, or its caps do not cover
	// the pool.
	ErrRefused = errors.New("the monitors refused the key, or its caps do not cover the pool")
	// ErrUnreachable: no monitor answered in time.
	ErrUnreachable = errors.New("no monitor answered in time")
	// ErrLocked: another client (another node's server) holds the image's
	// exclusive lock, and a server of an exclusive image never takes it
	// from a live owner.
	ErrLocked = errors.New("another Ceph client holds the RBD image's exclusive lock")
)

// Cause is ErrRefused or ErrUnreachable when msg, a server's error, names
// one; nil otherwise.
func Cause(msg string) error {
	for _, e := range []error{ErrRefused, ErrUnreachable, ErrLocked} {
		if strings.Contains(msg, e.Error()) {
			return e
		}
	}
	return nil
}

// Access is what a server needs to open one RBD image: the monitors
// (mon_host form), the cephx client (id without "client.") and its key,
// the pool and the image. Its file is 0600 in the agent's run dir (tmpfs),
// so that a server the healer starts after an agent restart finds it;
// unstage removes it.
type Access struct {
	MonHost string `json:"monHost"`
	Client  string `json:"client"`
	Key     string `json:"key"`
	Pool    string `json:"pool"`
	Image   string `json:"image"`
	// Exclusive: the server takes the image's exclusive lock explicitly
	// before it serves, which turns off librbd's hand-over of the lock to
	// another writer (F14): a second node's server is refused, even if
	// the Attachment lost a record. Every stage but a read-only one sets
	// it; an access file without it (an older agent's) serves as before.
	Exclusive bool `json:"exclusive,omitempty"`
}

// String describes a without its key.
func (a Access) String() string {
	return fmt.Sprintf("monitors=%s client=%s image=%s/%s", a.MonHost, a.Client, a.Pool, a.Image)
}

func (a Access) check() error {
	if a.MonHost == "" || a.Client == "" || a.Key == "" || a.Pool == "" || a.Image == "" {
		return fmt.Errorf("RBD image access %s: monitors, client, key, pool and image are all required", a)
	}
	return nil
}

// Write stores a at path, 0600, atomically.
func Write(path string, a Access) error {
	if err := a.check(); err != nil {
		return err
	}
	b, err := json.Marshal(a)
	if err != nil {
		return err
	}
	if err := atomicfile.Write(path, b, 0o600); err != nil {
		return fmt.Errorf("write RBD image access %s: %w", path, err)
	}
	return nil
}

// Read loads the access file at path.
func Read(path string) (Access, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return Access{}, fmt.Errorf("RBD image access: %w", err)
	}
	var a Access
	if err := json.Unmarshal(b, &a); err != nil {
		return Access{}, fmt.Errorf("RBD image access %s: %w", path, err)
	}
	return a, a.check()
}

// ClientsPath is where the server of the access file at path records its
// Ceph client addresses: beside it, with a name no access file has.
func ClientsPath(path string) string { return strings.TrimSuffix(path, ".json") + ".clients" }

// writeClients records addrs, the addresses of the server's Ceph client,
// for the agent: lock breaking blocklists exactly those, so each server
// writes its own before it says ready (a stale list would fence a dead
// client while the live one keeps writing).
func writeClients(path string, addrs []string) error {
	b, err := json.Marshal(addrs)
	if err != nil {
		return err
	}
	if err := atomicfile.Write(ClientsPath(path), b, 0o600); err != nil {
		return fmt.Errorf("record the ceph client addresses: %w", err)
	}
	return nil
}

// ReadClients returns the Ceph client addresses that the last server of
// the access file at path recorded; none when no server did.
func ReadClients(path string) ([]string, error) {
	b, err := os.ReadFile(ClientsPath(path))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	} else if err != nil {
		return nil, fmt.Errorf("ceph client addresses: %w", err)
	}
	var addrs []string
	if err := json.Unmarshal(b, &addrs); err != nil {
		return nil, fmt.Errorf("ceph client addresses %s: %w", ClientsPath(path), err)
	}
	return addrs, nil
}
