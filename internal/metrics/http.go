package metrics

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Disabled is the address that turns an endpoint off.
const Disabled = "0"

// Handler serves the metrics of g at /metrics, for processes without a
// controller-runtime manager (whose metrics server does the same).
func Handler(g prometheus.Gatherer) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(g, promhttp.HandlerOpts{ErrorHandling: promhttp.HTTPErrorOnError}))
	return mux
}

// HealthHandler serves /healthz (the process answers) and /readyz (ready
// returns nil).
func HealthHandler(ready func() error) http.Handler {
	return ProbeHandler(func() error { return nil }, ready)
}

// ProbeHandler serves /healthz (alive returns nil) and /readyz (ready
// returns nil); a failed check answers 503 with its error.
func ProbeHandler(alive, ready func() error) http.Handler {
	check := func(f func() error) http.HandlerFunc {
		return func(w http.ResponseWriter, _ *http.Request) {
			if err := f(); err != nil {
				http.Error(w, err.Error(), http.StatusServiceUnavailable)
				return
			}
			_, _ = w.Write([]byte("ok"))
		}
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", check(alive))
	mux.HandleFunc("/readyz", check(ready))
	return mux
}

// Listen opens addr for an endpoint; nil for Disabled or "".
func Listen(addr string) (net.Listener, error) {
	if addr == "" || addr == Disabled {
		return nil, nil
	}
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", addr, err)
	}
	return l, nil
}

// Serve serves h on l until ctx ends (at once with nil l: disabled).
func Serve(ctx context.Context, l net.Listener, h http.Handler) error {
	if l == nil {
		<-ctx.Done()
		return nil
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second, WriteTimeout: 30 * time.Second}
	done := make(chan struct{})
	go func() {
		select {
		case <-ctx.Done():
			sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			_ = srv.Shutdown(sctx)
		case <-done:
		}
	}()
	err := srv.Serve(l)
	close(done)
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return err
}
