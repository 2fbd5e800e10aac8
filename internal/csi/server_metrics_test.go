package csi

import (
	"context"
	"errors"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/berth-io/berth/internal/metrics"
	"github.com/berth-io/berth/internal/testenv"
)

// TestObserveCallsCountsByMethodAndCode drives the metrics interceptor with
// fake handlers: each call is counted under its method and the gRPC code it
// answered (a plain error as Unknown), timed once, and passed through as is.
func TestObserveCallsCountsByMethodAndCode(t *testing.T) {
	reg := prometheus.NewRegistry()
	ops, err := metrics.NewOps(reg, metrics.BoundaryCSI)
	if err != nil {
		t.Fatal(err)
	}
	observe := observeCalls(ops)
	refused := status.Error(codes.FailedPrecondition, "held by another node")
	plain := errors.New("no status")
	calls := []struct {
		method string
		err    error
	}{
		{"/csi.v1.Node/NodeStageVolume", nil},
		{"/csi.v1.Node/NodeStageVolume", refused},
		{"/csi.v1.Node/NodeStageVolume", nil},
		{"/csi.v1.Node/NodeUnstageVolume", plain},
		{"/csi.v1.Controller/CreateVolume", nil},
	}
	for _, c := range calls {
		resp, err := observe(context.Background(), "req", &grpc.UnaryServerInfo{FullMethod: c.method},
			func(context.Context, any) (any, error) { return "resp", c.err })
		if resp != "resp" || !errors.Is(err, c.err) {
			t.Errorf("%s: interceptor changed the answer: %v, %v", c.method, resp, err)
		}
	}
	got, err := testenv.Gathered(reg)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]float64{
		testenv.Series("berth_csi_requests_total", "operation", "NodeStageVolume", "code", "OK"):                 2,
		testenv.Series("berth_csi_requests_total", "operation", "NodeStageVolume", "code", "FailedPrecondition"): 1,
		testenv.Series("berth_csi_requests_total", "operation", "NodeUnstageVolume", "code", "Unknown"):          1,
		testenv.Series("berth_csi_requests_total", "operation", "CreateVolume", "code", "OK"):                    1,
		testenv.Series("berth_csi_request_duration_seconds_count", "operation", "NodeStageVolume"):               3,
		testenv.Series("berth_csi_request_duration_seconds_count", "operation", "NodeUnstageVolume"):             1,
		testenv.Series("berth_csi_request_duration_seconds_count", "operation", "CreateVolume"):                  1,
	}
	for series, n := range want {
		if got[series] != n {
			t.Errorf("%s = %v, want %v", series, got[series], n)
		}
	}
	if _, extra := got[testenv.Series("berth_csi_requests_total", "operation", "NodeUnstageVolume", "code", "OK")]; extra {
		t.Error("a failed call was also counted as OK")
	}
}

// TestObserveCallsWithoutMetrics: a server built without metrics still
// serves (the interceptor records nothing).
func TestObserveCallsWithoutMetrics(t *testing.T) {
	resp, err := observeCalls(nil)(context.Background(), nil, &grpc.UnaryServerInfo{FullMethod: "/csi.v1.Identity/Probe"},
		func(context.Context, any) (any, error) { return "ok", nil })
	if resp != "ok" || err != nil {
		t.Errorf("got %v, %v", resp, err)
	}
}
