package nbd

import (
	"bytes"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/vishvananda/netlink/nl"
)

// FuzzNetlinkReplies parses generic netlink payloads as connect and status
// replies. Seeds are replies in the kernel's layout (nbd_genl_connect's
// NBD_ATTR_INDEX, nbd_genl_status's nested device list).
func FuzzNetlinkReplies(f *testing.F) {
	f.Add(genlReply(nbdCmdConnect, nl.NewRtAttr(attrIndex, nl.Uint32Attr(7))), 7)
	f.Add(statusReply(map[int]bool{2: true}), 2)
	f.Add(statusReply(map[int]bool{0: false, 15: true}), 15)
	f.Add(genlReply(nbdCmdStatus), 0)
	f.Fuzz(func(t *testing.T, msg []byte, index int) {
		idx, err := parseConnectReply([][]byte{msg})
		if err == nil {
			// The index is the first NBD_ATTR_INDEX, and a reply that
			// carries it again in the kernel's layout gives the same.
			again, err := parseConnectReply([][]byte{genlReply(nbdCmdConnect, nl.NewRtAttr(attrIndex, nl.Uint32Attr(uint32(idx))))})
			if err != nil || again != idx {
				t.Fatalf("index %d re-encoded: %d, %v", idx, again, err)
			}
		}
		conn, err := parseStatusReply([][]byte{msg}, index)
		if err != nil && conn {
			t.Fatal("connected with an error")
		}
		// Parsing never reads past what it was given, nor changes it.
		cp := bytes.Clone(msg)
		_, _ = parseStatusReply([][]byte{cp[:len(cp):len(cp)]}, index)
		if !bytes.Equal(cp, msg) {
			t.Fatal("parsing changed the message")
		}
	})
}

// FuzzFindByBackend lays out /sys/block/<name>/backend as the kernel would
// with a fuzzed device name and backend, and checks what FindByBackend finds.
func FuzzFindByBackend(f *testing.F) {
	f.Add("nbd12", "berth:pvc-3f2a9c1e\n", "pvc-3f2a9c1e")
	f.Add("nbd0", "\n", "a")
	f.Add("nbd01", "berth:a\n", "a")
	f.Add("nbd+1", "berth:a", "a")
	base := f.TempDir()
	if st, err := os.Stat("/dev/shm"); err == nil && st.IsDir() {
		if d, err := os.MkdirTemp("/dev/shm", "berth-fuzz-sysfs-"); err == nil {
			base = d
			f.Cleanup(func() { _ = os.RemoveAll(d) })
		}
	}
	f.Fuzz(func(t *testing.T, name, backend, volume string) {
		if name == "" || name == "." || name == ".." || strings.ContainsAny(name, "/\x00*?[\\") || len(name) > 200 {
			return // not a file name, or a glob pattern
		}
		sysfs, err := os.MkdirTemp(base, "")
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = os.RemoveAll(sysfs) }()
		dir := filepath.Join(sysfs, "block", name)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "backend"), []byte(backend), 0o644); err != nil {
			t.Fatal(err)
		}
		idx, found, err := FindByBackend(sysfs, BackendID("n1", volume))
		if err != nil {
			t.Fatal(err)
		}
		want := strings.HasPrefix(name, "nbd") && strings.TrimRight(backend, "\n") == BackendID("n1", volume)
		if want {
			n, err := strconv.Atoi(name[3:])
			want = err == nil && strconv.Itoa(n) == name[3:]
		}
		if found != want {
			t.Fatalf("dir %q backend %q volume %q: found %v", name, backend, volume, found)
		}
		// The device found is the one that directory describes.
		if found && filepath.Base(DevicePath(idx)) != name {
			t.Fatalf("dir %q names device %s", name, DevicePath(idx))
		}
	})
}
