package agent

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	csispec "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
)

// csiProbeTimeout bounds one readiness check's call; the probe's own
// timeout is longer.
const csiProbeTimeout = 3 * time.Second

// csiAnswers is the agent's readiness: the CSI Identity service answers
// Probe through the socket at path (what kubelet dials), ready.
func csiAnswers(path string) healthz.Checker {
	return func(req *http.Request) error {
		ctx := context.Background()
		if req != nil {
			ctx = req.Context()
		}
		ctx, cancel := context.WithTimeout(ctx, csiProbeTimeout)
		defer cancel()
		conn, err := grpc.NewClient("unix://"+path, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			return fmt.Errorf("CSI socket %s: %w", path, err)
		}
		defer func() { _ = conn.Close() }()
		resp, err := csispec.NewIdentityClient(conn).Probe(ctx, &csispec.ProbeRequest{})
		if err != nil {
			return fmt.Errorf("CSI Probe on %s: %w", path, err)
		}
		// An unset ready means ready (CSI spec).
		if r := resp.GetReady(); r != nil && !r.GetValue() {
			return errors.New("CSI Probe: not ready")
		}
		return nil
	}
}
