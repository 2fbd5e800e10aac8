// Package csi is berth's gRPC boundary: the CSI Identity, Controller and Node
// services. Inner packages return wrapped errors; this package alone turns
// them into gRPC status codes.
package csi

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/go-logr/logr"
	"google.golang.org/grpc"
	"google.golang.org/grpc/status"

	"github.com/berth-io/berth/internal/metrics"
)

// Services are the CSI services one endpoint serves; nil ones are left out.
type Services struct {
	Identity   csi.IdentityServer
	Controller csi.ControllerServer
	Node       csi.NodeServer
}

// Listen opens a Unix socket endpoint ("unix:///path" or a plain path),
// replacing a stale socket file left by a dead process.
func Listen(endpoint string) (net.Listener, error) {
	path := strings.TrimPrefix(endpoint, "unix://")
	if path == "" || !filepath.IsAbs(path) {
		return nil, fmt.Errorf("endpoint %q: want unix:///absolute/path", endpoint)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o750); err != nil {
		return nil, fmt.Errorf("endpoint folder: %w", err)
	}
	if err := os.Remove(path); err != nil && !os.IsNotExist(err) {
		return nil, fmt.Errorf("remove stale socket: %w", err)
	}
	l, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", path, err)
	}
	return l, nil
}

// NewServer returns a gRPC server with the given services, a logging
// interceptor and, with m set, one that counts and times every call.
func NewServer(log logr.Logger, m *metrics.Ops, s Services) *grpc.Server {
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(observeCalls(m), logCalls(log)))
	if s.Identity != nil {
		csi.RegisterIdentityServer(srv, s.Identity)
	}
	if s.Controller != nil {
		csi.RegisterControllerServer(srv, s.Controller)
	}
	if s.Node != nil {
		csi.RegisterNodeServer(srv, s.Node)
	}
	return srv
}

// Serve serves on l until ctx ends, then stops gracefully.
func Serve(ctx context.Context, srv *grpc.Server, l net.Listener) error {
	done := make(chan struct{})
	go func() {
		select {
		case <-ctx.Done():
			srv.GracefulStop()
		case <-done:
		}
	}()
	err := srv.Serve(l)
	close(done)
	if ctx.Err() != nil {
		return nil //nolint:nilerr // stopped on purpose
	}
	return err
}

// observeCalls records each call's method, gRPC code and latency. The
// method names are those of the registered services, a bounded set: calls
// to unknown methods never reach a unary interceptor.
func observeCalls(m *metrics.Ops) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		start := time.Now()
		resp, err := handler(ctx, req)
		m.Observe(methodName(info.FullMethod), status.Code(err).String(), time.Since(start))
		return resp, err
	}
}

func methodName(full string) string { return full[strings.LastIndex(full, "/")+1:] }

// logCalls logs every call with its outcome. Requests are not logged whole:
// they may carry secrets.
func logCalls(log logr.Logger) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		method := methodName(info.FullMethod)
		l := log.WithValues("method", method)
		if id := volumeIDOf(req); id != "" {
			l = l.WithValues("volume", id)
		}
		resp, err := handler(logr.NewContext(ctx, l), req)
		switch {
		case err != nil:
			l.Info("call failed", "code", status.Code(err).String(), "error", err.Error())
		case isProbe(method):
		default:
			l.V(1).Info("call done")
		}
		return resp, err
	}
}

func isProbe(method string) bool {
	return method == "Probe" || strings.HasSuffix(method, "GetCapabilities") || method == "GetPluginInfo"
}

func volumeIDOf(req any) string {
	if r, ok := req.(interface{ GetVolumeId() string }); ok {
		return r.GetVolumeId()
	}
	if r, ok := req.(interface{ GetName() string }); ok {
		return r.GetName()
	}
	return ""
}
