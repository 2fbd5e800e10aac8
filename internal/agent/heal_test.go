package agent

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
)

// countingAPI is an API reader holding objs that counts its Gets and, with
// down set, fails them as an unreachable API server would.
func countingAPI(t *testing.T, gets *atomic.Int32, down bool, objs ...client.Object) client.Reader {
	t.Helper()
	return fakeAPI(t, objs...).WithInterceptorFuncs(interceptor.Funcs{
		Get: func(ctx context.Context, c client.WithWatch, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
			gets.Add(1)
			if down {
				return errors.New("connection refused")
			}
			return c.Get(ctx, key, obj, opts...)
		},
	}).Build()
}

// healAgent is nbdAgent with the API reader and cache of Volumes given.
func healAgent(t *testing.T, api, cached client.Reader) (*Agent, *fakeProcs) {
	t.Helper()
	nbd := &fakeNBD{devs: map[string]string{}}
	procs := &fakeProcs{t: t, root: t.TempDir(), nbd: nbd}
	a := newTestAgent(t, Config{API: api, Volumes: cached, Images: fakeImages{path: "/images/vol-1.img"}, Userspace: &UserspaceConfig{
		Root: t.TempDir(), Binary: "/usr/bin/berth", Keeper: &hostKeeper{}, Transport: TransportNBD, NBD: nbd,
		Start: procs.start, StopPID: procs.stop, ProcRoot: procs.root, DeadConnTimeout: time.Minute,
	}})
	if _, err := nbdOf(a).ensureServer(context.Background(), "vol-1", "/images/vol-1.img"); err != nil {
		t.Fatal(err)
	}
	procs.kill(1001) // the agent's restart took the server with it
	return a, procs
}

// TestHealReadsVolumeFromCache: a volume whose Volume the cache holds is
// healed without reading the API server, even one that does not answer.
func TestHealReadsVolumeFromCache(t *testing.T) {
	var gets atomic.Int32
	a, procs := healAgent(t, countingAPI(t, &gets, true), fakeAPI(t, userspaceVolume()).Build())
	vol, res, err := a.Heal(context.Background(), "vol-1")
	if err != nil || res != HealRestarted || vol == nil || vol.Name != "vol-1" {
		t.Fatalf("Heal = %v, %s, %v; want restarted with the Volume", vol, res, err)
	}
	if n := gets.Load(); n != 0 {
		t.Errorf("Heal read the API server %d times; want none when the cache has the Volume", n)
	}
	if len(procs.started) != 2 {
		t.Errorf("started %d servers, want a second one", len(procs.started))
	}
}

// TestHealVolumeMissingFromCache: a Volume the cache lacks is read from
// the API server.
func TestHealVolumeMissingFromCache(t *testing.T) {
	var gets atomic.Int32
	a, _ := healAgent(t, countingAPI(t, &gets, false, userspaceVolume()), fakeAPI(t).Build())
	if vol, res, err := a.Heal(context.Background(), "vol-1"); err != nil || res != HealRestarted || vol == nil {
		t.Fatalf("Heal = %v, %s, %v; want restarted with the Volume read from the API server", vol, res, err)
	}
	if gets.Load() == 0 {
		t.Error("the API server was not read for a Volume the cache lacks")
	}
}

// TestHealImageFileBeforeVolume: a volume whose image is a file here gets
// its server even while the API server does not answer (right after an
// agent restart, every volume waits on those reads), and even when its
// Volume object is gone: the volume is staged and its I/O waits. Gone
// image and Volume: the clear error, and no server.
func TestHealImageFileBeforeVolume(t *testing.T) {
	var gets atomic.Int32
	down := countingAPI(t, &gets, true)
	a, procs := healAgent(t, down, down)
	if vol, res, err := a.Heal(context.Background(), "vol-1"); err != nil || res != HealRestarted || vol != nil {
		t.Fatalf("Heal with the API server down = %v, %s, %v; want restarted, no Volume", vol, res, err)
	}
	if len(procs.started) != 2 {
		t.Errorf("started %d servers, want a second one", len(procs.started))
	}

	a, procs = healAgent(t, countingAPI(t, &gets, false), fakeAPI(t).Build())
	if vol, res, err := a.Heal(context.Background(), "vol-1"); err != nil || res != HealRestarted || vol != nil {
		t.Fatalf("Heal of a volume whose Volume is gone = %v, %s, %v; want restarted from its image file", vol, res, err)
	}

	a, procs = healAgent(t, countingAPI(t, &gets, false), fakeAPI(t).Build())
	a.images = fakeImages{gone: true}
	vol, res, err := a.Heal(context.Background(), "vol-1")
	if !errors.Is(err, ErrVolumeNotFound) || res != HealSkipped || vol != nil || !strings.Contains(err.Error(), "Volume object is gone") {
		t.Fatalf("Heal = %v, %s, %v; want skipped with ErrVolumeNotFound saying the Volume is gone", vol, res, err)
	}
	if len(procs.started) != 1 {
		t.Errorf("a server was started for a volume whose Volume and image are gone")
	}
}
