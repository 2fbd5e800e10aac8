package ceph

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"

	v1 "github.com/berth-io/berth/api/v1alpha1"
	"github.com/berth-io/berth/internal/backend"
)

// This file and check_stub.go build without the ceph tag: the operator
// turns a StorageCluster's spec.ceph into a Config and classifies Check's
// errors whether or not the Ceph libraries are linked in.

// Config names the Ceph cluster, pool and cephx client to store volumes in.
type Config struct {
	// Monitors: the mon_host value (comma-separated ADDR:PORT or [v2:...]).
	Monitors string
	// Pool holds the images and the name maps; DataPool, optional, the
	// images' data (an erasure-coded pool, say).
	Pool, DataPool string
	// Client is the cephx id without "client."; Key its secret (never
	// logged: String leaves it out).
	Client, Key string
	// Features of new images; empty: layering and exclusive-lock.
	Features []string
	// ConnectTimeout bounds connecting (client_mount_timeout); OpTimeout
	// each monitor and OSD request, so that a call running past its
	// caller's deadline ends too. Zero: 10 s and 30 s.
	ConnectTimeout, OpTimeout time.Duration
	// BlocklistExpire is how long Ceph keeps a fenced client on its
	// blocklist if berth never takes it off (zero: DefaultBlocklistExpire).
	BlocklistExpire time.Duration
	// Enter runs the connect (nil: as is) where the connection must start:
	// inside a holder's network namespace in the netns mode. librados opens
	// every socket from threads the connect starts, which stay there.
	Enter func(connect func() error) error
}

func (c Config) enter(connect func() error) error {
	if c.Enter == nil {
		return connect()
	}
	return c.Enter(connect)
}

// DefaultBlocklistExpire: a backstop only, since berth takes a fenced
// client off once its node is back and cleaned. It is long because an
// entry that expires while the node is cut off but still running would let
// that node write again to a volume another node holds.
const DefaultBlocklistExpire = 5 * 365 * 24 * time.Hour

func (c Config) blocklistExpire() time.Duration {
	if c.BlocklistExpire <= 0 {
		return DefaultBlocklistExpire
	}
	return c.BlocklistExpire
}

// String describes the config without the key.
func (c Config) String() string {
	return fmt.Sprintf("monitors=%s pool=%s data-pool=%s client=%s features=%s",
		c.Monitors, c.Pool, c.DataPool, c.Client, strings.Join(c.Features, ","))
}

// What a connection can fail on, for callers that report it (the
// operator's BackendReady condition). Errors from New and Check wrap them.
var (
	// ErrMonitorsUnreachable: no monitor answered within the connect
	// timeout, or a monitor's host name does not resolve.
	ErrMonitorsUnreachable = errors.New("monitors unreachable")
	// ErrAuthentication: the monitors refused the client's key, or its
	// caps do not allow what berth does on the pool.
	ErrAuthentication = errors.New("key refused or caps insufficient")
	// ErrPoolNotFound: the pool (or data pool) does not exist; it is a
	// backend.ErrNotFound too.
	ErrPoolNotFound = fmt.Errorf("pool %w", backend.ErrNotFound)
	// ErrNotBuilt: this berth binary was built without the ceph tag.
	ErrNotBuilt = errors.New("berth built without the ceph backend (build tag ceph)")
)

// Ceph's monitor ports: the legacy protocol's (msgr1) and msgr2's default.
const legacyMonPort = "6789"

// MonHost turns monitor addresses ([v1:|v2:]HOST:PORT, as
// StorageCluster.spec.ceph.monitors has them) into a mon_host value. Port
// 6789 without a prefix is msgr1, any other msgr2. Host names are resolved
// here with lookup, so that librados gets addresses only and a name that
// does not resolve is reported as such (nil lookup: the system resolver).
func MonHost(ctx context.Context, monitors []string, lookup func(ctx context.Context, host string) ([]string, error)) (string, error) {
	if lookup == nil {
		lookup = net.DefaultResolver.LookupHost
	}
	var out []string
	for _, m := range monitors {
		proto, addr := "", m
		if p, rest, ok := strings.Cut(m, ":"); ok && (p == "v1" || p == "v2") {
			proto, addr = p, rest
		}
		host, port, err := net.SplitHostPort(addr)
		if err != nil || host == "" || !validPort(port) {
			return "", fmt.Errorf("monitor %q: want HOST:PORT (port 1-65535)", m)
		}
		if proto == "" {
			proto = "v2"
			if port == legacyMonPort {
				proto = "v1"
			}
		}
		ips := []string{host}
		if net.ParseIP(host) == nil {
			if ips, err = lookup(ctx, host); err == nil && len(ips) == 0 {
				err = errors.New("no address")
			}
			if err != nil {
				return "", fmt.Errorf("%w: monitor host %s does not resolve: %w", ErrMonitorsUnreachable, host, err)
			}
		}
		for _, ip := range ips {
			out = append(out, "["+proto+":"+net.JoinHostPort(ip, port)+"]")
		}
	}
	if len(out) == 0 {
		return "", errors.New("no monitors")
	}
	return strings.Join(out, ","), nil
}

// validPort: librados gets the port as written, so only a plain decimal
// port is passed on (FuzzMonHost found "0" and words going through).
func validPort(p string) bool {
	n, err := strconv.Atoi(p)
	return err == nil && n >= 1 && n <= 65535 && strconv.Itoa(n) == p
}

// ErrSecretNamespace: berth reads a ceph StorageCluster's Secret only in
// its own namespace, the one its roles grant Secrets in.
var ErrSecretNamespace = errors.New("berth reads Secrets only in its own namespace")

// CheckSecretRef refuses a Secret outside namespace, berth's own.
func CheckSecretRef(ref v1.CephSecretReference, namespace string) error {
	if ref.Namespace != namespace {
		return fmt.Errorf("Secret %s/%s: %w, %s: create it there", ref.Namespace, ref.Name, ErrSecretNamespace, namespace)
	}
	return nil
}

// ConfigFor is the Config of a StorageCluster's spec.ceph with the client
// of its Secret (userID, userKey): what the operator checks and the CSI
// controller opens. Monitor host names are resolved with lookup (nil: the
// system resolver).
func ConfigFor(ctx context.Context, spec *v1.CephSpec, userID, userKey string, lookup func(ctx context.Context, host string) ([]string, error)) (Config, error) {
	monitors := make([]string, len(spec.Monitors))
	for i, m := range spec.Monitors {
		monitors[i] = string(m)
	}
	features := make([]string, len(spec.ImageFeatures))
	for i, f := range spec.ImageFeatures {
		features[i] = string(f)
	}
	cfg := Config{
		Pool: spec.Pool, DataPool: spec.DataPool,
		// Ceph-CSI's userID is the id without "client."; be lenient.
		Client: strings.TrimPrefix(userID, "client."), Key: userKey,
		Features: features,
	}
	var err error
	cfg.Monitors, err = MonHost(ctx, monitors, lookup)
	return cfg, err
}

// Store is a connected ceph backend: backend.Store, its pool's usage, and
// Close at shutdown.
type Store interface {
	backend.Store
	PoolUsage(ctx context.Context) (PoolUsage, error)
	Close()
}

// PoolUsage is what a pool holds and can still take, in bytes of data (not
// raw bytes: replication is accounted for).
type PoolUsage struct {
	// Free is what Capacity returns: the pool's max_avail, less if its
	// byte quota is lower.
	Free int64
	// Used is the data stored in the pool (ceph df's stored).
	Used int64
}

// Fencing is what lock breaking needs of Ceph (fence.Blocklister): put a
// dead node's Ceph clients on the blocklist and break the image lock they
// hold, and take them off again. Open's Store has it too.
type Fencing interface {
	// FenceClients blocklists addrs and breaks the lock they hold on the
	// image of volume id.
	FenceClients(ctx context.Context, id string, addrs []string) error
	// UnfenceClients takes addrs off the blocklist.
	UnfenceClients(ctx context.Context, addrs []string) error
	Close()
}

// Records keep on RBD images the record that they hold a filesystem (image
// metadata): what the node agent reads and writes with a stage's client.
// Open's Store has it too.
type Records interface {
	Format(ctx context.Context, id string) (rec backend.FormatRecord, found bool, err error)
	RecordFormat(ctx context.Context, id, fsType string, at time.Time) error
	Close()
}

// imagePrefix begins every image berth makes in the pool.
const imagePrefix = "berth-"

// ImageName is the RBD image of volume id: derived from the ID so that a
// failed create's leftover is found by name, and so that the node agent
// finds the image whose format record it reads.
func ImageName(id string) string { return imagePrefix + id }
