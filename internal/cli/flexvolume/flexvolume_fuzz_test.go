package flexvolume

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/go-logr/logr"

	"github.com/berth-io/berth/internal/agent/socket"
	flex "github.com/berth-io/berth/internal/flexvolume"
	"github.com/berth-io/berth/internal/testenv"
)

// agentOps records what reached the agent through its real socket.
type agentOps struct {
	mu       sync.Mutex
	mounts   []flex.MountRequest
	unmounts []string
}

func (o *agentOps) Node() string { return "node-1" }
func (o *agentOps) FlexMount(_ context.Context, r flex.MountRequest) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.mounts = append(o.mounts, r)
	return nil
}
func (o *agentOps) FlexUnmount(_ context.Context, dir string) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.unmounts = append(o.unmounts, dir)
	return nil
}

func (o *agentOps) take() ([]flex.MountRequest, []string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	m, u := o.mounts, o.unmounts
	o.mounts, o.unmounts = nil, nil
	return m, u
}

// FuzzDriverCall runs the driver as kubelet does (a command and its
// arguments) against a real agent socket: it prints exactly one result
// object, and what reaches the agent is what the arguments say. Seeds are
// kubelet's real calls.
func FuzzDriverCall(f *testing.F) {
	if os.Geteuid() != 0 {
		f.Skip("the agent socket admits only root; run as root")
	}
	sock := filepath.Join(f.TempDir(), "agent.sock")
	l, err := socket.Listen(sock)
	if err != nil {
		f.Fatal(err)
	}
	ops := &agentOps{}
	testenv.Serve(f, "agent socket", func(ctx context.Context) error { return socket.NewServer(ops, logr.Discard()).Serve(ctx, l) })

	dir := "/var/lib/kubelet/pods/0b5e7c2a-1111/volumes/berth.io~berth/pv-1"
	opts := `{"kubernetes.io/fsType":"ext4","kubernetes.io/pod.name":"web-0","kubernetes.io/pod.namespace":"default","kubernetes.io/pod.uid":"0b5e7c2a-1111","kubernetes.io/pvOrVolumeName":"pv-1","kubernetes.io/readwrite":"rw","kubernetes.io/serviceAccount.name":"default"}`
	f.Add("init", "", "")
	f.Add("mount", dir, opts)
	f.Add("unmount", dir, "")
	f.Add("getvolumename", opts, "")
	f.Add("mount", "relative", opts)
	// Not UTF-8: JSON on the socket would turn the path into another one.
	f.Add("mount", "/var/lib/kubelet/pods/x/volumes/berth.io~berth/\xff", opts)
	f.Add("unmount", "/var/lib/kubelet/pods/x/volumes/berth.io~berth/\xff", "")
	f.Fuzz(func(t *testing.T, cmd, arg1, arg2 string) {
		args := []string{cmd}
		for _, a := range []string{arg1, arg2} {
			if a != "" {
				args = append(args, a)
			}
		}
		var out bytes.Buffer
		err := Config{Args: args, Socket: sock, Timeout: 10 * time.Second, Out: &out}.Run(context.Background())
		if strings.Count(out.String(), "\n") != 1 {
			t.Fatalf("printed %q: not one line", out.String())
		}
		var res flex.Result
		dec := json.NewDecoder(&out)
		dec.DisallowUnknownFields()
		if derr := dec.Decode(&res); derr != nil {
			t.Fatalf("printed no result object: %v", derr)
		}
		switch res.Status {
		case flex.StatusSuccess, flex.StatusNotSupported:
			if err != nil {
				t.Fatalf("%s with error %v", res.Status, err)
			}
		case flex.StatusFailure:
			if err == nil {
				t.Fatal("failure without error")
			}
		default:
			t.Fatalf("status %q", res.Status)
		}
		mounts, unmounts := ops.take()
		want, perr := flex.ParseMount(args[1:])
		switch {
		case cmd == "mount" && perr == nil:
			if len(mounts) != 1 || mounts[0] != want || res.Status != flex.StatusSuccess {
				t.Fatalf("mount %q reached the agent as %+v (%s)", args[1:], mounts, res.Message)
			}
		case cmd == "unmount" && len(args) == 2 && filepath.IsAbs(args[1]) && utf8.ValidString(args[1]):
			if len(unmounts) != 1 || unmounts[0] != args[1] {
				t.Fatalf("unmount %q reached the agent as %q", args[1], unmounts)
			}
		default:
			if len(mounts)+len(unmounts) != 0 {
				t.Fatalf("%q reached the agent: %+v %q", args, mounts, unmounts)
			}
		}
	})
}
