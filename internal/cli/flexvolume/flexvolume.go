// Package flexvolume is the `berth flexvolume` command, which kubelet runs
// as <volume-plugin-dir>/berth.io~berth/berth. It prints exactly one JSON
// object on stdout and forwards mount and unmount to the node agent.
package flexvolume

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/berth-io/berth/internal/agent/socket"
	"github.com/berth-io/berth/internal/cli"
	flex "github.com/berth-io/berth/internal/flexvolume"
)

// Config of one driver call.
type Config struct {
	Args    []string // command and its arguments, as kubelet passes them
	Socket  string
	Timeout time.Duration
	Out     io.Writer
}

// errFailed means a Failure result was printed: the exit code says so too,
// and nothing else may be written (kubelet reads stdout and stderr together).
var errFailed = fmt.Errorf("flexvolume call failed: %w", cli.ErrReported)

// Run performs the call and prints its result.
func (c Config) Run(ctx context.Context) error {
	res := c.result(ctx)
	if err := json.NewEncoder(c.Out).Encode(res); err != nil {
		return err
	}
	if res.Status == flex.StatusFailure {
		return errFailed
	}
	return nil
}

func (c Config) result(ctx context.Context) flex.Result {
	if len(c.Args) == 0 {
		return flex.Result{Status: flex.StatusFailure, Message: "no command given (init, mount, unmount)"}
	}
	ctx, cancel := context.WithTimeout(ctx, c.Timeout)
	defer cancel()
	var req socket.Request
	switch cmd, args := c.Args[0], c.Args[1:]; cmd {
	case "init":
		return c.init(ctx)
	case "mount":
		m, err := flex.ParseMount(args)
		if err != nil {
			return flex.Result{Status: flex.StatusFailure, Message: err.Error()}
		}
		req = socket.Request{Op: socket.OpMount, Mount: &m}
	case "unmount":
		if len(args) != 1 || !filepath.IsAbs(args[0]) || !utf8.ValidString(args[0]) {
			return flex.Result{Status: flex.StatusFailure, Message: "unmount wants one absolute UTF-8 <mount dir>"}
		}
		req = socket.Request{Op: socket.OpUnmount, MountDir: args[0]}
	default:
		return flex.Result{Status: flex.StatusNotSupported, Message: fmt.Sprintf("%q is not supported by berth (attach: false)", cmd)}
	}
	resp, err := socket.Call(ctx, c.Socket, req)
	if err != nil {
		// The words init uses too: the pod's event should say plainly why.
		return flex.Result{Status: flex.StatusFailure, Message: "agent not reachable: " + err.Error()}
	}
	if !resp.OK {
		return flex.Result{Status: flex.StatusFailure, Message: resp.Err().Error()}
	}
	return flex.Result{Status: flex.StatusSuccess}
}

// init answers kubelet's probe. It succeeds without the agent (kubelet
// probes when it finds the driver, maybe before the agent serves), and says
// in the message whether the agent answered the handshake.
func (c Config) init(ctx context.Context) flex.Result {
	res := flex.Result{Status: flex.StatusSuccess, Capabilities: &flex.Capabilities{Attach: false}}
	resp, err := socket.Call(ctx, c.Socket, socket.Request{Op: socket.OpHandshake})
	switch {
	case err != nil:
		res.Message = "agent not reachable yet: " + err.Error()
	case !resp.OK:
		res.Message = "agent refused the handshake: " + resp.Message
	default:
		res.Message = fmt.Sprintf("%s on node %s (protocol %d)", flex.ReadyMessage, resp.Node, resp.Version)
	}
	return res
}

// socketPath finds the agent socket: $BERTH_AGENT_SOCKET, the file the agent
// wrote beside the driver, or the default.
func socketPath(self string) string {
	if s := os.Getenv("BERTH_AGENT_SOCKET"); s != "" {
		return s
	}
	if b, err := os.ReadFile(filepath.Join(filepath.Dir(self), flex.SocketFile)); err == nil {
		if s := strings.TrimSpace(string(b)); s != "" {
			return s
		}
	}
	return flex.DefaultSocket
}

// driverPath is the path the driver was run by: kubelet and the agent run
// it by its absolute path. That path comes first, not /proc/self/exe: the
// agent runs it through the node's root (/proc/<pid>/root/...), where
// /proc/self/exe names the file by its path on the node, which in the
// agent's container is another file or none.
func driverPath() string {
	if filepath.IsAbs(os.Args[0]) {
		return os.Args[0]
	}
	if self, err := os.Executable(); err == nil {
		return self
	}
	return os.Args[0]
}

// Command is `berth flexvolume`; cmd/berth also runs it when started from a
// Flexvolume plugin folder.
func Command() cli.Command {
	return cli.Command{
		Name:    "flexvolume",
		Summary: "Flexvolume driver that kubelet runs (init, mount, unmount); forwards to the agent",
		Main: func(ctx context.Context, args []string, stdio cli.IO) error {
			return Config{Args: args, Socket: socketPath(driverPath()), Timeout: 10 * time.Minute, Out: stdio.Stdout}.Run(ctx)
		},
	}
}
