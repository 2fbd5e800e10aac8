package sanity

import (
	"context"
	"net"
	"testing"

	"google.golang.org/grpc"
)

// pluginCapabilities is the one call the node proxy answers from the
// controller.
const pluginCapabilities = "/csi.v1.Identity/GetPluginCapabilities"

// rawCodec passes messages through as bytes, unparsed.
type rawCodec struct{}

func (rawCodec) Marshal(v any) ([]byte, error) { return *v.(*[]byte), nil }
func (rawCodec) Unmarshal(data []byte, v any) error {
	*v.(*[]byte) = append([]byte(nil), data...)
	return nil
}
func (rawCodec) Name() string { return "proto" }

// nodeWithControllerIdentity serves listen as the node plugin at node, but
// answers GetPluginCapabilities from the controller at ctrl. csi-test asks
// the node's endpoint whether the plugin has a controller service and,
// when not (berth's agent and CSI controller are apart, as in a cluster),
// skips its whole-lifecycle specs ("Node Service should work", "should be
// idempotent"); answered this way, they run. Every other call reaches the
// agent unchanged, errors included.
func nodeWithControllerIdentity(t *testing.T, listen, node, ctrl string) {
	t.Helper()
	nodeConn, ctrlConn := conn(t, node), conn(t, ctrl)
	forward := func(_ any, stream grpc.ServerStream) error {
		method, _ := grpc.MethodFromServerStream(stream)
		to := nodeConn
		if method == pluginCapabilities {
			to = ctrlConn
		}
		var req, resp []byte
		if err := stream.RecvMsg(&req); err != nil {
			return err
		}
		if err := to.Invoke(stream.Context(), method, &req, &resp, grpc.ForceCodec(rawCodec{})); err != nil {
			return err
		}
		return stream.SendMsg(&resp)
	}
	l, err := (&net.ListenConfig{}).Listen(context.Background(), "unix", listen)
	if err != nil {
		t.Fatal(err)
	}
	s := grpc.NewServer(grpc.UnknownServiceHandler(forward), grpc.ForceServerCodec(rawCodec{}))
	go func() { _ = s.Serve(l) }()
	t.Cleanup(s.Stop)
}
