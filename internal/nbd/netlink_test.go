package nbd

import (
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"
)

const testFamily = 0x1234

// fakeExec records each request's bytes and answers with replies.
type fakeExec struct {
	sent    [][]byte
	replies [][]byte
	err     error
}

func (f *fakeExec) exec(req *nl.NetlinkRequest) ([][]byte, error) {
	f.sent = append(f.sent, req.Serialize())
	return f.replies, f.err
}

func newFakeKernel(f *fakeExec) *netlinkKernel {
	return &netlinkKernel{family: func() (uint16, error) { return testFamily, nil }, exec: f.exec}
}

// decoded is one request as the kernel would see it.
type decoded struct {
	flags uint16
	cmd   uint8
	attrs map[uint16]syscall.NetlinkRouteAttr
}

func decode(t *testing.T, b []byte) decoded {
	t.Helper()
	ne := nl.NativeEndian()
	if int(ne.Uint32(b[0:4])) != len(b) {
		t.Fatalf("nlmsg length %d, message is %d bytes", ne.Uint32(b[0:4]), len(b))
	}
	if typ := ne.Uint16(b[4:6]); typ != testFamily {
		t.Fatalf("message type %#x, want the family %#x", typ, testFamily)
	}
	d := decoded{flags: ne.Uint16(b[6:8]), attrs: map[uint16]syscall.NetlinkRouteAttr{}}
	g := b[unix.SizeofNlMsghdr:]
	d.cmd = g[0]
	if g[1] != genlVersion {
		t.Fatalf("genl version %d, want %d", g[1], genlVersion)
	}
	attrs, err := attrsOf(g)
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range attrs {
		if _, dup := d.attrs[attrType(a)]; dup {
			t.Fatalf("attribute %d twice", attrType(a))
		}
		d.attrs[attrType(a)] = a
	}
	if d.flags&(unix.NLM_F_REQUEST|unix.NLM_F_ACK) != unix.NLM_F_REQUEST|unix.NLM_F_ACK {
		t.Fatalf("flags %#x: want REQUEST|ACK", d.flags)
	}
	return d
}

// value returns attribute typ's payload; the test fails when it is missing
// or valid refuses it (it is not what).
func (d decoded) value(t *testing.T, typ uint16, what string, valid func([]byte) bool) []byte {
	t.Helper()
	a, ok := d.attrs[typ]
	if !ok || !valid(a.Value) {
		t.Fatalf("attribute %d: missing or not %s (%q)", typ, what, a.Value)
	}
	return a.Value
}

func (d decoded) u64(t *testing.T, typ uint16) uint64 {
	t.Helper()
	v := d.value(t, typ, "a u64", func(v []byte) bool { return len(v) == 8 })
	return nl.NativeEndian().Uint64(v)
}

func (d decoded) u32(t *testing.T, typ uint16) uint32 {
	t.Helper()
	v := d.value(t, typ, "a u32", func(v []byte) bool { return len(v) == 4 })
	return nl.NativeEndian().Uint32(v)
}

func (d decoded) str(t *testing.T, typ uint16) string {
	t.Helper()
	v := d.value(t, typ, "NUL-terminated", func(v []byte) bool { return len(v) > 0 && v[len(v)-1] == 0 })
	return string(v[:len(v)-1])
}

// sockFDs decodes NBD_ATTR_SOCKETS -> NBD_SOCK_ITEM -> NBD_SOCK_FD.
func (d decoded) sockFDs(t *testing.T) []int {
	t.Helper()
	a, ok := d.attrs[attrSockets]
	if !ok || a.Attr.Type&unix.NLA_F_NESTED == 0 {
		t.Fatalf("sockets attribute missing or not marked nested: %+v", a.Attr)
	}
	items, err := nl.ParseRouteAttr(a.Value)
	if err != nil {
		t.Fatal(err)
	}
	var fds []int
	for _, it := range items {
		if attrType(it) != sockItem {
			t.Fatalf("socket list holds attribute %d, want NBD_SOCK_ITEM", attrType(it))
		}
		fields, err := nl.ParseRouteAttr(it.Value)
		if err != nil || len(fields) != 1 || attrType(fields[0]) != sockFD || len(fields[0].Value) != 4 {
			t.Fatalf("socket item: %v %+v", err, fields)
		}
		fds = append(fds, int(nl.NativeEndian().Uint32(fields[0].Value)))
	}
	return fds
}

// genlReply is a reply payload: genlmsghdr + attributes.
func genlReply(cmd uint8, attrs ...*nl.RtAttr) []byte {
	b := (&nl.Genlmsg{Command: cmd, Version: genlVersion}).Serialize()
	for _, a := range attrs {
		b = append(b, a.Serialize()...)
	}
	return b
}

func twoSocks(t *testing.T) []*os.File {
	t.Helper()
	a, b := socketpair(t)
	t.Cleanup(func() { _ = a.Close(); _ = b.Close() })
	return []*os.File{a, b}
}

func TestNetlinkConnect(t *testing.T) {
	f := &fakeExec{replies: [][]byte{genlReply(nbdCmdConnect, nl.NewRtAttr(attrIndex, nl.Uint32Attr(7)))}}
	k := newFakeKernel(f)
	socks := twoSocks(t)
	idx, err := k.Connect(ConnectParams{Index: -1, Size: 1 << 30, Socks: socks,
		DeadConnTimeout: 90*time.Second + time.Millisecond, Backend: "berth:vol-1"})
	if err != nil {
		t.Fatal(err)
	}
	if idx != 7 {
		t.Fatalf("index %d, want 7 from the reply", idx)
	}
	d := decode(t, f.sent[0])
	if d.cmd != nbdCmdConnect {
		t.Fatalf("cmd %d, want NBD_CMD_CONNECT", d.cmd)
	}
	if _, ok := d.attrs[attrIndex]; ok {
		t.Fatal("index -1 must leave NBD_ATTR_INDEX out")
	}
	if got := d.u64(t, attrSizeBytes); got != 1<<30 {
		t.Fatalf("size %d", got)
	}
	if got := d.u64(t, attrBlockSizeBytes); got != 4096 {
		t.Fatalf("block size %d, want the 4096 default", got)
	}
	want := uint64(flagHasFlags | flagSendFlush | flagSendFUA | flagSendTrim | flagSendWriteZeroes | flagCanMultiConn)
	if got := d.u64(t, attrServerFlags); got != want {
		t.Fatalf("server flags %#x, want %#x", got, want)
	}
	if got := d.u64(t, attrDeadConnTimeout); got != 91 {
		t.Fatalf("dead conn timeout %d s, want 91 (rounded up)", got)
	}
	if _, ok := d.attrs[attrTimeout]; ok {
		t.Fatal("no Timeout must leave NBD_ATTR_TIMEOUT out")
	}
	if got := d.str(t, attrBackendID); got != "berth:vol-1" {
		t.Fatalf("backend %q", got)
	}
	fds := d.sockFDs(t)
	if len(fds) != 2 || fds[0] != int(socks[0].Fd()) || fds[1] != int(socks[1].Fd()) {
		t.Fatalf("socket fds %v, want %d and %d", fds, socks[0].Fd(), socks[1].Fd())
	}
	if len(d.attrs) != 6 {
		t.Fatalf("%d attributes, want 6: %v", len(d.attrs), d.attrs)
	}
}

func TestNetlinkConnectIndexReadOnlyTimeout(t *testing.T) {
	f := &fakeExec{replies: [][]byte{genlReply(nbdCmdConnect, nl.NewRtAttr(attrIndex, nl.Uint32Attr(3)))}}
	k := newFakeKernel(f)
	_, err := k.Connect(ConnectParams{Index: 3, Size: 1 << 20, BlockSize: 512, Socks: twoSocks(t)[:1],
		ReadOnly: true, Timeout: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	d := decode(t, f.sent[0])
	if got := d.u32(t, attrIndex); got != 3 {
		t.Fatalf("index %d", got)
	}
	if got := d.u64(t, attrBlockSizeBytes); got != 512 {
		t.Fatalf("block size %d", got)
	}
	if got := d.u64(t, attrServerFlags); got&flagReadOnly == 0 {
		t.Fatalf("server flags %#x lack READ_ONLY", got)
	}
	if got := d.u64(t, attrTimeout); got != 30 {
		t.Fatalf("timeout %d", got)
	}
	for _, typ := range []uint16{attrDeadConnTimeout, attrBackendID} {
		if _, ok := d.attrs[typ]; ok {
			t.Fatalf("attribute %d set without its parameter", typ)
		}
	}
}

func TestNetlinkConnectRefusesBadParams(t *testing.T) {
	f := &fakeExec{}
	k := newFakeKernel(f)
	for _, p := range []ConnectParams{
		{Index: -1, Size: 1 << 20},                                          // no sockets
		{Index: -1, Socks: twoSocks(t)},                                     // no size
		{Index: -1, Size: 1 << 20, BlockSize: 1000, Socks: twoSocks(t)},     // not a power of two
		{Index: -1, Size: 1<<20 + 512, BlockSize: 4096, Socks: twoSocks(t)}, // partial last block
		{Index: -1, Size: 1<<20 + 100, Socks: twoSocks(t)},                  // not whole sectors
	} {
		if _, err := k.Connect(p); err == nil {
			t.Fatalf("Connect(%+v) succeeded", p)
		}
	}
	if len(f.sent) != 0 {
		t.Fatal("a refused Connect sent a request")
	}
}

// A size that is not a multiple of 4096 (a volume of 10^9 bytes) gets
// 512-byte blocks, so that the last block is whole.
func TestNetlinkConnectBlockSizeFitsSize(t *testing.T) {
	for _, c := range []struct {
		size, want int64
	}{{1 << 30, 4096}, {1e9, 512}} {
		f := &fakeExec{replies: [][]byte{genlReply(nbdCmdConnect, nl.NewRtAttr(attrIndex, nl.Uint32Attr(0)))}}
		k := newFakeKernel(f)
		if _, err := k.Connect(ConnectParams{Index: -1, Size: c.size, Socks: twoSocks(t)}); err != nil {
			t.Fatal(err)
		}
		if got := decode(t, f.sent[0]).u64(t, attrBlockSizeBytes); got != uint64(c.want) {
			t.Fatalf("size %d: block size %d, want %d", c.size, got, c.want)
		}
	}
}

func TestNetlinkConnectErrors(t *testing.T) {
	k := newFakeKernel(&fakeExec{err: unix.EBUSY})
	if _, err := k.Connect(ConnectParams{Index: 1, Size: 1 << 20, Socks: twoSocks(t)}); !errors.Is(err, unix.EBUSY) {
		t.Fatalf("error %v, want EBUSY kept", err)
	}
	k = newFakeKernel(&fakeExec{replies: [][]byte{genlReply(nbdCmdConnect)}})
	if _, err := k.Connect(ConnectParams{Index: 1, Size: 1 << 20, Socks: twoSocks(t)}); err == nil {
		t.Fatal("a reply without an index was accepted")
	}
	k.family = func() (uint16, error) { return 0, unix.ENOENT }
	if _, err := k.Connect(ConnectParams{Index: 1, Size: 1 << 20, Socks: twoSocks(t)}); !errors.Is(err, unix.ENOENT) {
		t.Fatalf("error %v, want the family lookup's", err)
	}
}

func TestNetlinkReconfigure(t *testing.T) {
	f := &fakeExec{}
	k := newFakeKernel(f)
	socks := twoSocks(t)
	if err := k.Reconfigure(4, "berth:vol-2", socks, 2*time.Minute); err != nil {
		t.Fatal(err)
	}
	d := decode(t, f.sent[0])
	if d.cmd != nbdCmdReconfigure {
		t.Fatalf("cmd %d", d.cmd)
	}
	if got := d.u32(t, attrIndex); got != 4 {
		t.Fatalf("index %d", got)
	}
	if got := d.u64(t, attrDeadConnTimeout); got != 120 {
		t.Fatalf("dead conn timeout %d", got)
	}
	// The kernel refuses a reconfigure of a device with a backend id without it.
	if got := d.str(t, attrBackendID); got != "berth:vol-2" {
		t.Fatalf("backend %q", got)
	}
	if fds := d.sockFDs(t); len(fds) != 2 || fds[0] != int(socks[0].Fd()) {
		t.Fatalf("fds %v", fds)
	}
	if len(d.attrs) != 4 {
		t.Fatalf("%d attributes, want 4", len(d.attrs))
	}

	// No backend identifier: none sent.
	if err := k.Reconfigure(5, "", socks[:1], 0); err != nil {
		t.Fatal(err)
	}
	d = decode(t, f.sent[1])
	for _, typ := range []uint16{attrBackendID, attrDeadConnTimeout} {
		if _, ok := d.attrs[typ]; ok {
			t.Fatalf("attribute %d sent without a value", typ)
		}
	}
	f.err = unix.EINVAL
	if err := k.Reconfigure(5, "", socks, 0); !errors.Is(err, unix.EINVAL) {
		t.Fatalf("error %v, want EINVAL kept", err)
	}
}

func TestNetlinkDisconnect(t *testing.T) {
	f := &fakeExec{}
	k := newFakeKernel(f)
	if err := k.Disconnect(9); err != nil {
		t.Fatal(err)
	}
	d := decode(t, f.sent[0])
	if d.cmd != nbdCmdDisconnect || d.u32(t, attrIndex) != 9 || len(d.attrs) != 1 {
		t.Fatalf("disconnect request: cmd %d attrs %v", d.cmd, d.attrs)
	}
}

func statusReply(devs map[int]bool) []byte {
	list := nl.NewRtAttr(unix.NLA_F_NESTED|attrDeviceList, nil)
	for idx, conn := range devs {
		item := list.AddRtAttr(unix.NLA_F_NESTED|deviceItem, nil)
		item.AddRtAttr(deviceIndex, nl.Uint32Attr(uint32(idx)))
		c := byte(0)
		if conn {
			c = 1
		}
		item.AddRtAttr(deviceConnected, []byte{c})
	}
	return genlReply(nbdCmdStatus, list)
}

func TestNetlinkStatus(t *testing.T) {
	f := &fakeExec{replies: [][]byte{statusReply(map[int]bool{2: true, 3: false})}}
	k := newFakeKernel(f)
	for idx, want := range map[int]bool{2: true, 3: false, 4: false} {
		got, err := k.Status(idx)
		if err != nil {
			t.Fatal(err)
		}
		if got != want {
			t.Fatalf("nbd%d connected %v, want %v", idx, got, want)
		}
	}
	d := decode(t, f.sent[0])
	if d.cmd != nbdCmdStatus || len(d.attrs) != 1 {
		t.Fatalf("status request: cmd %d attrs %v", d.cmd, d.attrs)
	}
	if binary.Size(uint32(0)) != len(d.attrs[attrIndex].Value) {
		t.Fatal("index is not a u32")
	}
}

func writeBackend(t *testing.T, sysfs string, index int, id string) {
	t.Helper()
	dir := filepath.Join(sysfs, "block", "nbd"+itoa(index))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "backend"), []byte(id+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
}

// On a kernel without nbd, the real driver fails clearly at the family
// lookup (and sends nothing).
func TestNetlinkWithoutModule(t *testing.T) {
	if ok, _ := Available("/sys"); ok {
		t.Skip("this kernel has nbd; TestKernelNBD covers the real driver")
	}
	_, err := NewNetlink().Status(0)
	if err == nil || !strings.Contains(err.Error(), `family "nbd"`) {
		t.Fatalf("Status without the module: %v", err)
	}
}
