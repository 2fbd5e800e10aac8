package keeper_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"path/filepath"
	"testing"

	"github.com/berth-io/berth/internal/keeper"
)

// TestStatusAndLongList: Status answers one volume's entry, or not found;
// List still answers whole with more volumes than 64 KiB holds (~350),
// which a node with many userspace volumes has.
func TestStatusAndLongList(t *testing.T) {
	k := newFakeKernel()
	c := startKeeper(t, k)
	ctx := context.Background()
	const n = 500
	for i := range n {
		name := fmt.Sprintf("pvc-%08d-0000-0000-0000-000000000000", i)
		conn, err := c.Open(ctx, name, "/var/lib/kubelet/plugins/berth.io/userspace/"+name)
		if err != nil {
			t.Fatal(err)
		}
		_ = conn.File.Close()
	}
	name := fmt.Sprintf("pvc-%08d-0000-0000-0000-000000000000", 7)
	v, found, err := c.Status(ctx, name)
	if err != nil || !found || v.Name != name || v.ServerPID == 0 {
		t.Fatalf("Status(%s) = %+v, %v, %v; want its entry with the opener as server", name, v, found, err)
	}
	if v, found, err := c.Status(ctx, "pvc-none"); err != nil || found {
		t.Fatalf("Status of a volume not held = %+v, %v, %v; want not found", v, found, err)
	}
	vols, err := c.List(ctx)
	if err != nil || len(vols) != n {
		t.Fatalf("List = %d volumes, %v; want %d", len(vols), err, n)
	}
}

// TestStatusOfAnOlderKeeper: a keeper before OpStatus answers it as an
// unknown op; the client then finds the volume in List.
func TestStatusOfAnOlderKeeper(t *testing.T) {
	sock, _ := olderKeeper(t, func(op string) string {
		if op == keeper.OpList {
			return `{"volumes":[{"name":"a","mountpoint":"/m/a","initialized":true,"serverPID":42}]}`
		}
		return `{"error":"invalid request: unknown op \"status\"","code":"invalid"}`
	})
	c := keeper.NewClient(sock)
	v, found, err := c.Status(context.Background(), "a")
	if err != nil || !found || v.ServerPID != 42 {
		t.Fatalf("Status from an older keeper = %+v, %v, %v; want a's entry from List", v, found, err)
	}
	if _, found, err := c.Status(context.Background(), "b"); err != nil || found {
		t.Fatalf("Status of b from an older keeper = %v, %v; want not found", found, err)
	}
}

// olderKeeper serves a socket as a keeper from before some op would:
// answer gives the reply to each request's op. Closing the listener ends
// it, as the test's end does.
func olderKeeper(t *testing.T, answer func(op string) string) (string, *net.UnixListener) {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "old.sock")
	l, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: sock, Net: "unixpacket"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
	go func() {
		for {
			c, err := l.AcceptUnix()
			if err != nil {
				return
			}
			buf := make([]byte, 4096)
			n, _, _, _, _ := c.ReadMsgUnix(buf, nil)
			var req struct{ Op string }
			_ = json.Unmarshal(buf[:n], &req)
			_, _, _ = c.WriteMsgUnix([]byte(answer(req.Op)), nil, nil)
			_ = c.Close()
		}
	}()
	return sock, l
}
