package launch

import (
	"context"
	"io"
	"os"
	"strings"
	"testing"
	"time"
)

// closedWithin reports whether r's other end is closed within d.
func closedWithin(t *testing.T, r *os.File, d time.Duration) bool {
	t.Helper()
	done := make(chan struct{})
	go func() { _, _ = io.Copy(io.Discard, r); close(done) }()
	select {
	case <-done:
		return true
	case <-time.After(d):
		return false
	}
}

func heldPipe(t *testing.T, g *HoldGroup) *os.File {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Close() })
	g.hold(w)
	return r
}

// TestHoldGroupReleasesAfterTheLastStart: no server of the pass resumes
// before every volume of it is done, and all do after.
func TestHoldGroupReleasesAfterTheLastStart(t *testing.T) {
	g := NewHoldGroup(3)
	a, b := heldPipe(t, g), heldPipe(t, g)
	g.Done()
	g.Done()
	if closedWithin(t, a, 50*time.Millisecond) {
		t.Fatal("released before the third volume was done")
	}
	g.Done()
	if !closedWithin(t, a, time.Second) || !closedWithin(t, b, time.Second) {
		t.Fatal("not released after the last volume was done")
	}
	// A server that starts after the release is not held.
	if c := heldPipe(t, g); !closedWithin(t, c, time.Second) {
		t.Fatal("a server held after the release")
	}
}

func TestHoldGroupReleaseAndNil(t *testing.T) {
	g := NewHoldGroup(5)
	a := heldPipe(t, g)
	g.Release()
	g.Release()
	if !closedWithin(t, a, time.Second) {
		t.Fatal("Release did not release")
	}
	var none *HoldGroup
	none.Done()
	none.Release()
	if HoldFrom(context.Background()) != nil {
		t.Fatal("a group in a bare context")
	}
	if HoldFrom(WithHold(context.Background(), g)) != g {
		t.Fatal("WithHold/HoldFrom lost the group")
	}
}

func TestHoldArgs(t *testing.T) {
	p := Params{Binary: "berth", KeeperSocket: "/k.sock", Volume: "v", Image: "/i", Mountpoint: "/m", Hold: NewHoldGroup(1)}
	args, err := p.args()
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(args, " "); !strings.HasSuffix(got, " --hold-fd 4") {
		t.Fatalf("fuse args with Hold: %s", got)
	}
	p.Transport = TransportNBD
	if args, _ := p.args(); strings.Contains(strings.Join(args, " "), "hold") {
		t.Fatalf("nbd args with Hold: %s", args)
	}
}
