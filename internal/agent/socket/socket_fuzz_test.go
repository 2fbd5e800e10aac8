package socket

import (
	"bytes"
	"context"
	"encoding/json"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/go-logr/logr"

	"github.com/berth-io/berth/internal/flexvolume"
)

// recordingOps records what reached the agent.
type recordingOps struct {
	mounts   []flexvolume.MountRequest
	unmounts []string
}

func (o *recordingOps) Node() string { return "node-1" }
func (o *recordingOps) FlexMount(_ context.Context, r flexvolume.MountRequest) error {
	o.mounts = append(o.mounts, r)
	return nil
}
func (o *recordingOps) FlexUnmount(_ context.Context, dir string) error {
	o.unmounts = append(o.unmounts, dir)
	return nil
}

// encoded is a request as the Flexvolume driver (Call) writes it.
func encoded(t testing.TB, req Request) []byte {
	var b bytes.Buffer
	if err := json.NewEncoder(&b).Encode(req); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

// FuzzAgentRequest feeds the agent socket's request reader and dispatcher
// any bytes a root client could send. Seeds are the driver's real requests
// for kubelet's init, mount and unmount calls.
func FuzzAgentRequest(f *testing.F) {
	m, err := flexvolume.ParseMount([]string{"/var/lib/kubelet/pods/0b5e7c2a-1111/volumes/berth.io~berth/pv-1",
		`{"kubernetes.io/fsType":"ext4","kubernetes.io/pod.name":"web-0","kubernetes.io/pod.namespace":"default","kubernetes.io/pod.uid":"0b5e7c2a-1111","kubernetes.io/pvOrVolumeName":"pv-1","kubernetes.io/readwrite":"rw"}`})
	if err != nil {
		f.Fatal(err)
	}
	f.Add(encoded(f, Request{Op: OpHandshake}))
	f.Add(encoded(f, Request{Op: OpMount, Mount: &m}))
	f.Add(encoded(f, Request{Op: OpUnmount, MountDir: m.MountDir}))
	f.Add([]byte(`{"op":"unmount","mountDir":"relative"}` + "\n"))
	f.Add([]byte(`{"op":"mount"}{"op":"unmount","mountDir":"/x"}`))
	f.Add([]byte(`{"op":"handshake","extra":1}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		req, err := readRequest(bytes.NewReader(data))
		line := data
		if i := bytes.IndexByte(data, '\n'); i >= 0 {
			line = data[:i+1]
		}
		if err != nil {
			if req != nil {
				t.Fatal("a refused request was returned")
			}
			return
		}
		if len(line) > MaxRequestBytes {
			t.Fatalf("accepted a %d-byte request (limit %d)", len(line), MaxRequestBytes)
		}
		if !json.Valid(bytes.TrimSpace(line)) {
			t.Fatalf("accepted %q, which is not one JSON value", line)
		}
		// What the agent understood, sent again, is understood the same.
		again, err := readRequest(bytes.NewReader(encoded(t, *req)))
		if err != nil || !reflect.DeepEqual(again, req) {
			t.Fatalf("round trip: %+v, %v; want %+v", again, err, req)
		}

		ops := &recordingOps{}
		s := NewServer(ops, logr.Discard())
		resp := s.do(t.Context(), req)
		if resp.OK == (resp.Code != "") {
			t.Fatalf("response %+v: ok and code disagree", resp)
		}
		if _, err := json.Marshal(resp); err != nil {
			t.Fatal(err)
		}
		for _, d := range ops.unmounts {
			if !filepath.IsAbs(d) {
				t.Fatalf("unmount of relative dir %q reached the agent", d)
			}
		}
		if len(ops.mounts)+len(ops.unmounts) > 1 {
			t.Fatal("one request did more than one operation")
		}
		if !resp.OK && resp.Code == CodeInvalid && len(ops.mounts)+len(ops.unmounts) > 0 {
			t.Fatal("an invalid request reached the agent")
		}
		if resp.OK && req.Op != OpHandshake && len(ops.mounts)+len(ops.unmounts) == 0 {
			t.Fatalf("%q answered OK without doing anything", req.Op)
		}
		if strings.Contains(resp.Message, "\n") {
			t.Fatalf("message %q spans lines", resp.Message)
		}
	})
}
