// Package heal is the volume healer: when the agent starts, and then every
// interval, it lists this node's stage records and has the agent restart the
// blockdev server of every staged userspace volume whose server is gone. The
// new server takes the FUSE connection over from the keeper (or reconnects
// the nbd device the kernel kept), so I/O that waited during the gap goes on
// without errors.
package heal

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/record"

	v1 "github.com/berth-io/berth/api/v1alpha1"
	"github.com/berth-io/berth/internal/agent"
	"github.com/berth-io/berth/internal/blockdev/launch"
	"github.com/berth-io/berth/internal/fence"
	"github.com/berth-io/berth/internal/metrics"
)

// Event reasons on the Volume.
const (
	ReasonHealed         = "BlockdevServerRestarted"
	ReasonKeeperDown     = "KeeperNotRunning"
	ReasonConnectionLost = "FUSEConnectionLost"
	ReasonHealFailed     = "HealFailed"
	// ReasonVolumeGone: a staged userspace volume's Volume or image is gone.
	ReasonVolumeGone = "VolumeGone"
)

// Holdings lists this node's holds (fence.Fencer.ListForNode).
type Holdings interface {
	ListForNode(ctx context.Context, node string) ([]fence.Hold, error)
}

// Volumes heals one volume under its lock (agent.Agent.Heal).
type Volumes interface {
	Heal(ctx context.Context, volumeID string) (*v1.Volume, agent.HealResult, error)
}

// Healer is a manager runnable.
type Healer struct {
	Node     string
	Holdings Holdings
	Volumes  Volumes
	Recorder record.EventRecorder
	Log      logr.Logger
	// Interval between passes after the first; 0: only the pass at start.
	Interval time.Duration
	// Parallel bounds the volumes healed at once (0: DefaultParallel).
	Parallel int
	// Timeout bounds the healing of one volume, API calls included
	// (0: 2 minutes).
	Timeout time.Duration
	// BusyRetry is how soon a pass runs again when a volume was busy
	// (another operation held its lock), even with Interval 0 (0: 5s).
	BusyRetry time.Duration
	// Metrics, when set, counts passes and volumes healed.
	Metrics *metrics.Heal
	// Local lists the volumes staged here, by the agent's own records, whose
	// images are files here (agent.Agent.StagedHere): no other node can
	// hold them, so a pass heals them first, without the API server, and
	// still when it cannot list this node's Attachments. nil: none.
	Local func() ([]string, error)
	// ListTimeout bounds the listing of the Attachments (0: 10s); an API
	// server that does not answer must not hold the volumes' I/O longer.
	ListTimeout time.Duration

	mu sync.Mutex
	// warned is the last warning reason per volume, so that a lasting
	// problem is reported once, not every pass.
	warned map[string]string
}

// DefaultParallel is how many volumes a pass heals at once. Healing is
// CPU-bound (a server process to start per volume) and competes with the
// I/O of the volumes healed first, so a wide pass gets every server going
// before that I/O takes the CPU. Measured with make bench's heal at scale
// (100 volumes under writers, 2 cores, passthrough on), time to each
// volume's first write, p50/p99 over interleaved runs: 128 at once
// 0.66-0.78s / 1.46-1.92s (3 runs), 16 at once 0.80-0.96s / 1.96-2.48s
// (2 runs). The bound keeps a node with thousands of volumes from forking
// them all at once.
const DefaultParallel = 128

// NeedLeaderElection is false: every node's agent heals its own volumes.
func (h *Healer) NeedLeaderElection() bool { return false }

// Start runs a pass now and then every Interval until ctx ends; a pass
// that found busy volumes is followed by another after BusyRetry.
func (h *Healer) Start(ctx context.Context) error {
	for {
		sum, err := h.Pass(ctx)
		if err != nil {
			h.Log.Error(err, "heal pass")
		}
		wait := h.Interval
		if retry := h.busyRetry(); sum[agent.HealBusy] > 0 && (wait <= 0 || retry < wait) {
			wait = retry
		}
		if wait <= 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(wait):
		}
	}
}

func (h *Healer) busyRetry() time.Duration {
	if h.BusyRetry > 0 {
		return h.BusyRetry
	}
	return 5 * time.Second
}

// Summary counts what one pass did, per result.
type Summary map[agent.HealResult]int

// Pass heals every volume this node has staged, concurrently, and returns
// what it did; a busy volume does not hold up the others. First those of
// Local, which need no API server: their I/O goes on before, and even
// without, the listing of this node's Attachments; then the other volumes
// that listing names. Volumes that fail are logged and reported as Events;
// the error is only for a failed listing.
func (h *Healer) Pass(ctx context.Context) (Summary, error) {
	sum := Summary{}
	healed := map[string]bool{}
	if h.Local != nil {
		local, err := h.Local()
		if err != nil {
			h.Log.Error(err, "volume records not read: healing the volumes of this node's Attachments only")
		}
		h.healAll(ctx, local, healed, sum)
	}
	listTimeout := h.ListTimeout
	if listTimeout <= 0 {
		listTimeout = 10 * time.Second
	}
	listCtx, cancel := context.WithTimeout(ctx, listTimeout)
	holds, err := h.Holdings.ListForNode(listCtx, h.Node)
	cancel()
	h.Metrics.Pass(err)
	if err != nil {
		return sum, err
	}
	var rest []string
	for _, hd := range holds {
		// Stage records have no pod; pod records imply one.
		rest = append(rest, hd.Volume)
	}
	h.healAll(ctx, rest, healed, sum)
	return sum, nil
}

// healAll heals vols not in healed at once (up to Parallel), marks them
// healed and counts their results in sum.
func (h *Healer) healAll(ctx context.Context, vols []string, healed map[string]bool, sum Summary) {
	parallel := h.Parallel
	if parallel <= 0 {
		parallel = DefaultParallel
	}
	var todo []string
	for _, vol := range vols {
		if !healed[vol] {
			healed[vol] = true
			todo = append(todo, vol)
		}
	}
	// The servers these heals start resume their I/O together, once all
	// are started (or at their bound): see launch.HoldGroup.
	hold := launch.NewHoldGroup(len(todo))
	defer hold.Release()
	ctx = launch.WithHold(ctx, hold)
	sem := make(chan struct{}, parallel)
	var (
		wg sync.WaitGroup
		mu sync.Mutex
	)
	for _, vol := range todo {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			res := h.heal(ctx, vol)
			mu.Lock()
			sum[res]++
			mu.Unlock()
		}()
	}
	wg.Wait()
}

func (h *Healer) timeout() time.Duration {
	if h.Timeout > 0 {
		return h.Timeout
	}
	return 2 * time.Minute
}

func (h *Healer) heal(ctx context.Context, id string) agent.HealResult {
	ctx, cancel := context.WithTimeout(ctx, h.timeout())
	defer cancel()
	log := h.Log.WithValues("volume", id)
	start := time.Now()
	vol, res, err := h.Volumes.Heal(ctx, id)
	outcome := string(res)
	if err != nil && !errors.Is(err, agent.ErrBusy) && !errors.Is(err, agent.ErrVolumeNotFound) {
		outcome = metrics.HealFailed
	}
	h.Metrics.Volume(outcome, time.Since(start))
	if err == nil {
		h.clear(id)
		if res == agent.HealRestarted {
			log.Info("healed: a new blockdev server took over the volume's kernel connection", "took", time.Since(start))
			h.event(vol, corev1.EventTypeNormal, ReasonHealed,
				"node "+h.Node+": the volume's blockdev server was gone (agent restart or crash); a new one took over its kernel connection and I/O goes on")
		}
		return res
	}
	if errors.Is(err, agent.ErrVolumeNotFound) {
		// Deleted under a staged volume (by hand, past its finalizer):
		// nothing to serve it from. Said once; the other volumes go on.
		if h.warn(id, ReasonVolumeGone) {
			log.Error(err, "heal skipped: the volume's Volume object or image is gone")
			h.event(vol, corev1.EventTypeWarning, ReasonVolumeGone, "node "+h.Node+": "+err.Error())
		}
		return agent.HealSkipped
	}
	if errors.Is(err, agent.ErrBusy) {
		// Another operation holds the volume (one stuck on a dead server
		// gives up at its tools' deadline): the other volumes go on, and
		// this one is tried again on a later pass.
		log.Info("volume busy; healing it on a later pass", "err", err.Error())
		return agent.HealBusy
	}
	reason, msg := ReasonHealFailed, "node "+h.Node+": could not restart the volume's blockdev server: "+err.Error()+"; its I/O waits until the agent succeeds (it retries)"
	switch {
	case errors.Is(err, agent.ErrKeeperDown):
		reason = ReasonKeeperDown
		msg = "node " + h.Node + ": the berth keeper is not running, so this userspace volume lost its FUSE connection and its I/O fails. " +
			"Make the keeper run again (berth agent pod), then restart the pods using this volume so that it is staged anew"
	case errors.Is(err, agent.ErrConnectionLost):
		reason = ReasonConnectionLost
		msg = "node " + h.Node + ": " + err.Error() + ", so its I/O fails. Restart the pods using this volume so that it is staged anew"
	}
	log.Error(err, "heal failed", "reason", reason)
	if h.warn(id, reason) {
		h.event(vol, corev1.EventTypeWarning, reason, msg)
	}
	return agent.HealSkipped
}

func (h *Healer) event(vol *v1.Volume, kind, reason, msg string) {
	if vol == nil || h.Recorder == nil {
		return
	}
	h.Recorder.Event(vol, kind, reason, msg)
}

// warn records reason for volume and tells whether it is new.
func (h *Healer) warn(volume, reason string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.warned == nil {
		h.warned = map[string]string{}
	}
	if h.warned[volume] == reason {
		return false
	}
	h.warned[volume] = reason
	return true
}

func (h *Healer) clear(volume string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.warned, volume)
}
