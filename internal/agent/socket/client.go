package socket

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
)

// Call sends one request to the agent socket at path and returns its
// response; a response with OK false is not an error here.
func Call(ctx context.Context, path string, req Request) (Response, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, "unix", path)
	if err != nil {
		return Response{}, fmt.Errorf("agent socket %s: %w (is berth agent running on this node?)", path, err)
	}
	defer func() { _ = c.Close() }()
	if dl, ok := ctx.Deadline(); ok {
		if err := c.SetDeadline(dl); err != nil {
			return Response{}, err
		}
	}
	// The agent may answer (and close) before reading the request, e.g. to
	// refuse a caller by its credentials: read its answer even when the
	// write failed.
	werr := json.NewEncoder(c).Encode(req)
	var resp Response
	if err := json.NewDecoder(c).Decode(&resp); err != nil {
		if werr != nil {
			return Response{}, fmt.Errorf("send request: %w", werr)
		}
		return Response{}, fmt.Errorf("read response: %w", err)
	}
	return resp, nil
}
