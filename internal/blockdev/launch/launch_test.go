package launch

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "github.com/berth-io/berth/api/v1alpha1"
)

func TestParamsArgs(t *testing.T) {
	fuse := Params{Binary: "berth", KeeperSocket: "/k.sock", Volume: "v", Image: "/i", Mountpoint: "/m", Workers: 3, Passthrough: true}
	args, err := fuse.args()
	if err != nil {
		t.Fatal(err)
	}
	want := "blockdev --volume v --image /i --ready-fd 3 --workers 3 --direct=true --keeper-socket /k.sock --mountpoint /m --passthrough=true"
	if got := strings.Join(args, " "); got != want {
		t.Fatalf("fuse args:\n%s\nwant\n%s", got, want)
	}
	fuse.Transport = TransportFUSE
	if again, _ := fuse.args(); !slices.Equal(again, args) {
		t.Fatal("Transport fuse differs from the empty default")
	}

	nbd := Params{Binary: "berth", Volume: "v", Image: "/i", Transport: TransportNBD, NoDirect: true,
		DeadConnTimeout: 90 * time.Second, Connections: 4}
	args, err = nbd.args()
	if err != nil {
		t.Fatal(err)
	}
	want = "blockdev --transport nbd --volume v --image /i --ready-fd 3 --workers 0 --direct=false --dead-conn-timeout 1m30s --connections 4"
	if got := strings.Join(args, " "); got != want {
		t.Fatalf("nbd args:\n%s\nwant\n%s", got, want)
	}

	id := uint32(7)
	for p, want := range map[*Params]string{
		{Binary: "berth", Volume: "v", Image: "/i", Transport: TransportUblk, IOErrorsFile: "/e"}:                              "blockdev --transport ublk --volume v --image /i --ready-fd 3 --workers 0 --direct=true --io-errors-file /e",
		{Binary: "berth", Volume: "v", Image: "/i", Transport: TransportUblk, UblkRecover: &id, Hold: &HoldGroup{}, Node: "n"}: "blockdev --transport ublk --volume v --image /i --ready-fd 3 --workers 0 --direct=true --node n --ublk-recover 7",
	} {
		args, err := p.args()
		if got := strings.Join(args, " "); err != nil || got != want {
			t.Fatalf("ublk args:\n%s (%v)\nwant\n%s", got, err, want)
		}
	}

	for name, p := range map[string]Params{
		"unknown transport":   {Binary: "b", Volume: "v", Image: "/i", Transport: "iscsi"},
		"fuse without keeper": {Binary: "b", Volume: "v", Image: "/i", Mountpoint: "/m"},
		"no image":            {Binary: "b", Volume: "v", Transport: TransportNBD},
	} {
		if _, err := p.args(); err == nil {
			t.Fatalf("%s: accepted", name)
		}
	}
}

func TestParseReady(t *testing.T) {
	for line, want := range map[string]string{"ready\n": "", "ready /dev/nbd3\n": "/dev/nbd3", "ready /dev/ublkb2\n": "/dev/ublkb2"} {
		got, err := parseReady(line)
		if err != nil || got != want {
			t.Fatalf("%q: %q %v, want %q", line, got, err, want)
		}
	}
	for _, bad := range []string{"ready", "readyx\n", "ready \n", "nope\n"} {
		if _, err := parseReady(bad); err == nil {
			t.Fatalf("%q accepted", bad)
		}
	}
}

func TestErrorLine(t *testing.T) {
	line := ErrorLine(errors.New("connect to ceph:\n key refused")) + "\n"
	if line != "error connect to ceph: key refused\n" {
		t.Fatalf("line %q", line)
	}
	_, err := parseReady(line)
	if err == nil || err.Error() != "connect to ceph: key refused" {
		t.Fatalf("parsed %v", err)
	}
}

func TestServerBinariesBesideBerth(t *testing.T) {
	for name, find := range map[string]func(string) string{SlimBinaryName: SlimBinary, CephBinaryName: CephBinary} {
		dir := t.TempDir()
		berth := filepath.Join(dir, "berth")
		if got := find(berth); got != "" {
			t.Fatalf("%s: none beside berth: %q", name, got)
		}
		bin := filepath.Join(dir, name)
		if err := os.WriteFile(bin, nil, 0o644); err != nil {
			t.Fatal(err)
		}
		if got := find(berth); got != "" {
			t.Fatalf("%s: not executable: %q", name, got)
		}
		if err := os.Chmod(bin, 0o755); err != nil {
			t.Fatal(err)
		}
		if got := find(berth); got != bin {
			t.Fatalf("%s: got %q, want %q", name, got, bin)
		}
	}
}

// TestTransportsMatchTheAPI: the transports are the API's values.
func TestTransportsMatchTheAPI(t *testing.T) {
	if TransportFUSE != string(v1.TransportFUSE) || TransportNBD != string(v1.TransportNBD) || TransportUblk != string(v1.TransportUblk) {
		t.Errorf("transports %q, %q, %q; the API has %q, %q, %q", TransportFUSE, TransportNBD, TransportUblk,
			v1.TransportFUSE, v1.TransportNBD, v1.TransportUblk)
	}
}
