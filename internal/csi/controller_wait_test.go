package csi

import (
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/berth-io/berth/api/v1alpha1"
)

// requestLog records the API requests a client makes.
type requestLog struct {
	mu   sync.Mutex
	reqs []string
}

func (l *requestLog) wrap(rt http.RoundTripper) http.RoundTripper {
	return roundTripper(func(r *http.Request) (*http.Response, error) {
		l.mu.Lock()
		l.reqs = append(l.reqs, r.Method+" "+r.URL.Path+"?"+r.URL.RawQuery)
		l.mu.Unlock()
		return rt.RoundTrip(r)
	})
}

func (l *requestLog) matching(part string) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for _, r := range l.reqs {
		if strings.Contains(r, part) {
			out = append(out, r)
		}
	}
	return out
}

type roundTripper func(*http.Request) (*http.Response, error)

func (f roundTripper) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// TestWaitVolumeWatches: on the real API server, the controller's wait for
// the agent returns as soon as the Volume changes, and meanwhile reads it
// once and watches it: no GET every 50 ms.
func TestWaitVolumeWatches(t *testing.T) {
	ctx := apiCtx(t, time.Minute)
	log := &requestLog{}
	cfg := rest.CopyConfig(env.Config)
	cfg.WrapTransport = log.wrap
	c, err := client.NewWithWatch(cfg, client.Options{Scheme: env.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	s := NewController(c, ControllerConfig{Wait: 30 * time.Second}, testr.New(t))
	const name = "wait-watch"
	vol := &v1.Volume{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: v1.VolumeSpec{StorageCluster: "c", Size: resource.MustParse("1Mi"), AccessMode: v1.ReadWriteOnce,
			FSType: "ext4", Node: "wait-node"},
	}
	create(ctx, t, vol)

	type result struct {
		vol *v1.Volume
		err error
		at  time.Time
	}
	got := make(chan result, 1)
	go func() {
		v, err := s.waitVolume(ctx, name, func(v *v1.Volume) bool { return v.Status.State == v1.VolumeAvailable })
		got <- result{v, err, time.Now()}
	}()
	time.Sleep(2 * time.Second)
	select {
	case r := <-got:
		t.Fatalf("wait returned before the change: %+v", r)
	default:
	}
	vol.Status.State = v1.VolumeAvailable
	if err := env.Client.Status().Update(ctx, vol); err != nil {
		t.Fatal(err)
	}
	changed := time.Now()
	var r result
	select {
	case r = <-got:
	case <-time.After(10 * time.Second):
		t.Fatal("wait did not return within 10s of the change")
	}
	if r.err != nil || r.vol.Status.State != v1.VolumeAvailable {
		t.Fatalf("wait = %+v, %v", r.vol, r.err)
	}
	if lag := r.at.Sub(changed); lag > time.Second {
		t.Errorf("wait returned %s after the change, want promptly", lag)
	}
	reads := log.matching("/volumes")
	var plain []string
	for _, q := range reads {
		if !strings.Contains(q, "watch=true") {
			plain = append(plain, q)
		}
	}
	t.Logf("requests while waiting 2s: %q", reads)
	if len(plain) > 2 {
		t.Errorf("%d reads of the Volume while waiting 2s (a GET loop): %q", len(plain), plain)
	}
	if len(reads) == len(plain) {
		t.Errorf("no watch while waiting: %q", reads)
	}

	// Removal is seen as promptly.
	gone := make(chan error, 1)
	go func() { gone <- s.waitGone(ctx, &v1.Volume{ObjectMeta: metav1.ObjectMeta{Name: name}}) }()
	time.Sleep(500 * time.Millisecond)
	if err := env.Client.Delete(ctx, vol); err != nil {
		t.Fatal(err)
	}
	deleted := time.Now()
	select {
	case err := <-gone:
		if err != nil {
			t.Fatal(err)
		}
		if lag := time.Since(deleted); lag > time.Second {
			t.Errorf("waitGone returned %s after the delete", lag)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("waitGone did not return within 10s of the delete")
	}
}
