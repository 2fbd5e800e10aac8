package ublk

import (
	"bytes"
	"encoding/binary"
	"reflect"
	"testing"
	"unsafe"
)

// The numbers below are the kernel's, written out from
// include/uapi/linux/ublk_cmd.h (Linux 6.12) and io_uring.h by hand, so
// that a slip in our encoders cannot hide behind the same slip here.

func TestIoctlNumbers(t *testing.T) {
	for _, c := range []struct {
		name      string
		got, want uint32
	}{
		{"UBLK_U_CMD_GET_DEV_INFO", uCmdGetDevInfo, 0x80207502},
		{"UBLK_U_CMD_ADD_DEV", uCmdAddDev, 0xc0207504},
		{"UBLK_U_CMD_DEL_DEV", uCmdDelDev, 0xc0207505},
		{"UBLK_U_CMD_START_DEV", uCmdStartDev, 0xc0207506},
		{"UBLK_U_CMD_STOP_DEV", uCmdStopDev, 0xc0207507},
		{"UBLK_U_CMD_SET_PARAMS", uCmdSetParams, 0xc0207508},
		{"UBLK_U_CMD_START_USER_RECOVERY", uCmdStartRecovery, 0xc0207510},
		{"UBLK_U_CMD_END_USER_RECOVERY", uCmdEndRecovery, 0xc0207511},
		{"UBLK_U_CMD_GET_FEATURES", uCmdGetFeatures, 0x80207513},
		{"UBLK_U_CMD_UPDATE_SIZE", uCmdUpdateSize, 0xc0207515},
		{"UBLK_U_IO_FETCH_REQ", uIOFetchReq, 0xc0107520},
		{"UBLK_U_IO_COMMIT_AND_FETCH_REQ", uIOCommitAndFetch, 0xc0107521},
	} {
		if c.got != c.want {
			t.Errorf("%s = %#x, want %#x", c.name, c.got, c.want)
		}
	}
}

// field is a kernel struct member: its name in our mirror and its offset.
type field struct {
	name string
	off  uintptr
}

// checkLayout compares a Go mirror with the kernel struct: size and every
// member's offset, and that binary encoding adds no padding of its own.
func checkLayout(t *testing.T, v any, size uintptr, fields []field) {
	t.Helper()
	typ := reflect.TypeOf(v)
	if typ.Size() != size {
		t.Errorf("%s: %d bytes, the kernel's has %d", typ.Name(), typ.Size(), size)
	}
	if n := binary.Size(v); n != int(size) {
		t.Errorf("%s: encodes to %d bytes, want %d", typ.Name(), n, size)
	}
	if typ.NumField() != len(fields) {
		t.Errorf("%s: %d fields, the kernel's has %d", typ.Name(), typ.NumField(), len(fields))
	}
	for _, f := range fields {
		sf, ok := typ.FieldByName(f.name)
		if !ok {
			t.Errorf("%s: no field %s", typ.Name(), f.name)
			continue
		}
		if sf.Offset != f.off {
			t.Errorf("%s.%s at %d, the kernel's at %d", typ.Name(), f.name, sf.Offset, f.off)
		}
	}
}

func TestStructLayouts(t *testing.T) {
	checkLayout(t, ctrlCmd{}, ctrlCmdSize, []field{
		{"DevID", 0}, {"QueueID", 4}, {"Len", 6}, {"Addr", 8}, {"Data", 16},
		{"DevPathLen", 24}, {"Pad", 26}, {"Reserved", 28},
	})
	checkLayout(t, DevInfo{}, devInfoSize, []field{
		{"NrHWQueues", 0}, {"QueueDepth", 2}, {"State", 4}, {"Pad0", 6},
		{"MaxIOBufBytes", 8}, {"DevID", 12}, {"ServerPID", 16}, {"Pad1", 20},
		{"Flags", 24}, {"ServerFlags", 32}, {"OwnerUID", 40}, {"OwnerGID", 44},
		{"Reserved1", 48}, {"Reserved2", 56},
	})
	checkLayout(t, IODesc{}, ioDescSize, []field{
		{"OpFlags", 0}, {"NrSectors", 4}, {"StartSector", 8}, {"Addr", 16},
	})
	checkLayout(t, ioCmd{}, ioCmdSize, []field{{"QID", 0}, {"Tag", 2}, {"Result", 4}, {"Addr", 8}})
	if s := unsafe.Sizeof(uringParams{}); s != paramsBytes {
		t.Errorf("io_uring_params: %d bytes, want %d", s, paramsBytes)
	}
	if o := unsafe.Offsetof(uringParams{}.sqOff); o != 40 {
		t.Errorf("io_uring_params.sq_off at %d, want 40", o)
	}
	if o := unsafe.Offsetof(uringParams{}.cqOff); o != 80 {
		t.Errorf("io_uring_params.cq_off at %d, want 80", o)
	}
	if s := unsafe.Sizeof(getEventsArg{}); s != 24 {
		t.Errorf("io_uring_getevents_arg: %d bytes, want 24", s)
	}
}

// TestEncodersMatchLayout: the encoders write what binary.Write writes for
// the mirror structs (whose layout is checked above), and the decoders,
// the hand-written ones of the I/O path too, read it back.
func TestEncodersMatchLayout(t *testing.T) {
	info := DevInfo{NrHWQueues: 1, QueueDepth: 128, State: 2, Pad0: 3, MaxIOBufBytes: 512 << 10,
		DevID: 7, ServerPID: -1, Pad1: 4, Flags: FlagUserRecovery | FlagUserRecoveryReissue,
		ServerFlags: 0xdead, OwnerUID: 5, OwnerGID: 6, Reserved1: 8, Reserved2: 9}
	got := make([]byte, devInfoSize)
	info.encode(got)
	assertEncoding(t, "dev info", got, info)
	back, err := DecodeDevInfo(got)
	if err != nil || back != info {
		t.Errorf("DecodeDevInfo = %+v, %v; want %+v", back, err, info)
	}

	cmd := ctrlCmd{DevID: 3, QueueID: noQueue, Len: 64, Addr: 0x1122334455667788, Data: 42,
		DevPathLen: 11, Pad: 12, Reserved: 13}
	got = make([]byte, ctrlCmdSize)
	cmd.encode(got)
	assertEncoding(t, "control command", got, cmd)
	if back, err := decodeCtrlCmd(got); err != nil || back != cmd {
		t.Errorf("decodeCtrlCmd = %+v, %v; want %+v", back, err, cmd)
	}

	desc := IODesc{OpFlags: OpWrite | IOFlagFUA, NrSectors: 8, StartSector: 1 << 40, Addr: 0xabc000}
	got = make([]byte, ioDescSize)
	mustEncode(got, desc)
	if back, err := DecodeIODesc(got); err != nil || back != desc {
		t.Errorf("DecodeIODesc = %+v, %v; want %+v", back, err, desc)
	}

	io := ioCmd{QID: 1, Tag: 99, Result: -5, Addr: 0x7f0000001000}
	got = make([]byte, ioCmdSize)
	io.encode(got)
	assertEncoding(t, "I/O command", got, io)
}

func assertEncoding(t *testing.T, what string, got []byte, v any) {
	t.Helper()
	var want bytes.Buffer
	if err := binary.Write(&want, binary.LittleEndian, v); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want.Bytes()) {
		t.Errorf("%s encodes to\n%x, want\n%x", what, got, want.Bytes())
	}
}

// TestParamsEncoding: struct ublk_params as SET_PARAMS reads it: len and
// types in the header, basic at 8, discard at 40, 60 bytes in all.
func TestParamsEncoding(t *testing.T) {
	p := Params{Attrs: AttrVolatileCache | AttrFUA, LogicalBSShift: 9, PhysicalBSShift: 12,
		IOOptShift: 12, IOMinShift: 9, MaxSectors: 1024, DevSectors: 2 << 20,
		DiscardGranularity: 4096, MaxDiscardSectors: 1 << 20, MaxWriteZeroesSectors: 1 << 20,
		MaxDiscardSegments: 1}
	b := make([]byte, 128)
	p.encode(b)
	want := map[int]uint64{ // offset: value, by width below
		0: paramsSize, 4: paramTypeBasic | paramTypeDiscard,
		8: AttrVolatileCache | AttrFUA, 16: 1024, 20: 0, 24: 2 << 20, 32: 0,
		40: 0, 44: 4096, 48: 1 << 20, 52: 1 << 20,
	}
	for off, v := range want {
		var got uint64
		switch off {
		case 24, 32:
			got = le.Uint64(b[off:])
		default:
			got = uint64(le.Uint32(b[off:]))
		}
		if got != v {
			t.Errorf("params at %d = %d, want %d", off, got, v)
		}
	}
	if b[12] != 9 || b[13] != 12 || b[14] != 12 || b[15] != 9 {
		t.Errorf("block size shifts = %v, want [9 12 12 9]", b[12:16])
	}
	if le.Uint16(b[56:]) != 1 {
		t.Errorf("max_discard_segments = %d, want 1", le.Uint16(b[56:]))
	}
	if paramsSize != 60 {
		t.Errorf("paramsSize = %d, want 60", paramsSize)
	}

	// No discard granularity: the discard type is left out.
	p.DiscardGranularity = 0
	p.encode(b)
	if types := le.Uint32(b[4:]); types != paramTypeBasic {
		t.Errorf("types without discard = %#x, want basic only", types)
	}
}

func TestDescriptorArea(t *testing.T) {
	// Depth 128: 3072 bytes of descriptors, one page; queue 1 starts past
	// the room for 4096 descriptors (96 KiB).
	if got := cmdBufSize(128, 4096); got != 4096 {
		t.Errorf("cmdBufSize(128) = %d, want 4096", got)
	}
	if got := cmdBufSize(200, 4096); got != 8192 {
		t.Errorf("cmdBufSize(200) = %d, want 8192", got)
	}
	if got := cmdBufOff(1, 4096); got != 98304 {
		t.Errorf("cmdBufOff(1) = %d, want 98304", got)
	}
}

func TestIODescRange(t *testing.T) {
	const size, buf = 1 << 20, 64 << 10
	for _, c := range []struct {
		name   string
		d      IODesc
		off, n int64
		bad    bool
	}{
		{"read at 0", IODesc{OpFlags: OpRead, NrSectors: 8}, 0, 4096, false},
		{"write at end", IODesc{OpFlags: OpWrite, StartSector: size/512 - 8, NrSectors: 8}, size - 4096, 4096, false},
		{"read past end", IODesc{OpFlags: OpRead, StartSector: size/512 - 4, NrSectors: 8}, 0, 0, true},
		{"read larger than the buffer", IODesc{OpFlags: OpRead, NrSectors: buf/512 + 1}, 0, 0, true},
		{"discard larger than the buffer", IODesc{OpFlags: OpDiscard, NrSectors: 1024}, 0, 512 << 10, false},
		{"flush", IODesc{OpFlags: OpFlush}, 0, 0, false},
		{"sector overflows", IODesc{OpFlags: OpRead, StartSector: 1 << 62, NrSectors: 1}, 0, 0, true},
		{"start past end", IODesc{OpFlags: OpDiscard, StartSector: size / 512 * 2}, 0, 0, true},
	} {
		off, n, err := c.d.Range(size, buf)
		if (err != nil) != c.bad || (!c.bad && (off != c.off || n != c.n)) {
			t.Errorf("%s: Range = %d, %d, %v; want %d, %d, error %v", c.name, off, n, err, c.off, c.n, c.bad)
		}
	}
}

func TestDecodeDevInfoRejects(t *testing.T) {
	if _, err := DecodeDevInfo(make([]byte, devInfoSize-1)); err == nil {
		t.Error("short dev info decoded")
	}
	b := make([]byte, devInfoSize)
	(&DevInfo{NrHWQueues: 1}).encode(b)
	if _, err := DecodeDevInfo(b); err == nil {
		t.Error("depth 0 accepted")
	}
	(&DevInfo{NrHWQueues: 1, QueueDepth: maxQueueDepth + 1}).encode(b)
	if _, err := DecodeDevInfo(b); err == nil {
		t.Error("depth beyond the driver's limit accepted")
	}
}
