// Package ublk speaks the Linux ublk userspace block driver protocol
// (include/uapi/linux/ublk_cmd.h, Linux 6.0 and later): control commands to
// /dev/ublk-control and request fetch/commit on /dev/ublkcN, both as
// io_uring URING_CMD submissions. The kernel keeps a ublk device with
// UBLK_F_USER_RECOVERY alive, queueing its I/O, while its server is dead; a
// new server takes it over with START/END_USER_RECOVERY. That makes the
// kernel the keeper of a userspace volume, with no FUSE connection to hand
// over.
//
// Serve adds a device and serves it (queue.go: one queue, requests one at
// a time on the queue's thread); Recover takes over a device whose server
// died. Control (control.go) is the client of the control device, and
// Probe tells whether the kernel has ublk with recovery.
//
// The io_uring part is our own, on golang.org/x/sys/unix (uring.go): no Go
// io_uring library that the module proxy serves here supports both
// IORING_SETUP_SQE128 (a control command is 32 bytes, more than the 16 a
// 64-byte SQE holds) and IORING_OP_URING_CMD, and the few operations needed
// are small enough to own.
package ublk

import (
	"encoding/binary"
	"fmt"
)

var le = binary.LittleEndian

// ioc encodes an ioctl number the way _IOC does on x86, arm and most other
// architectures (dir in the top 2 bits, then 14 bits of size).
func ioc(dir, typ, nr, size uint32) uint32 { return dir<<30 | size<<16 | typ<<8 | nr }

const (
	iocWrite = 1
	iocRead  = 2
)

// Control command numbers (_IOC_NR of UBLK_U_CMD_*).
const (
	cmdGetDevInfo    = 0x02
	cmdAddDev        = 0x04
	cmdDelDev        = 0x05
	cmdStartDev      = 0x06
	cmdStopDev       = 0x07
	cmdSetParams     = 0x08
	cmdGetParams     = 0x09
	cmdStartRecovery = 0x10
	cmdEndRecovery   = 0x11
	cmdGetDevInfo2   = 0x12
	cmdGetFeatures   = 0x13
	cmdDelDevAsync   = 0x14
	cmdUpdateSize    = 0x15
)

// I/O command numbers (_IOC_NR of UBLK_U_IO_*).
const (
	ioFetchReq       = 0x20
	ioCommitAndFetch = 0x21
	ioNeedGetData    = 0x22
)

// The commands, ioctl-encoded (UBLK_U_*). berth sends only these: the
// legacy plain numbers are off in kernels built without
// CONFIG_BLKDEV_UBLK_LEGACY_OPCODES.
var (
	uCmdGetDevInfo    = ioc(iocRead, 'u', cmdGetDevInfo, ctrlCmdSize)
	uCmdAddDev        = ioc(iocRead|iocWrite, 'u', cmdAddDev, ctrlCmdSize)
	uCmdDelDev        = ioc(iocRead|iocWrite, 'u', cmdDelDev, ctrlCmdSize)
	uCmdStartDev      = ioc(iocRead|iocWrite, 'u', cmdStartDev, ctrlCmdSize)
	uCmdStopDev       = ioc(iocRead|iocWrite, 'u', cmdStopDev, ctrlCmdSize)
	uCmdSetParams     = ioc(iocRead|iocWrite, 'u', cmdSetParams, ctrlCmdSize)
	uCmdGetParams     = ioc(iocRead, 'u', cmdGetParams, ctrlCmdSize)
	uCmdStartRecovery = ioc(iocRead|iocWrite, 'u', cmdStartRecovery, ctrlCmdSize)
	uCmdEndRecovery   = ioc(iocRead|iocWrite, 'u', cmdEndRecovery, ctrlCmdSize)
	uCmdGetFeatures   = ioc(iocRead, 'u', cmdGetFeatures, ctrlCmdSize)
	uCmdUpdateSize    = ioc(iocRead|iocWrite, 'u', cmdUpdateSize, ctrlCmdSize)

	uIOFetchReq       = ioc(iocRead|iocWrite, 'u', ioFetchReq, ioCmdSize)
	uIOCommitAndFetch = ioc(iocRead|iocWrite, 'u', ioCommitAndFetch, ioCmdSize)
)

// Feature flags: ublksrv_ctrl_dev_info.flags at ADD_DEV, and the bitmap
// GET_FEATURES returns.
const (
	FlagSupportZeroCopy     uint64 = 1 << 0
	FlagURingCmdCompInTask  uint64 = 1 << 1
	FlagNeedGetData         uint64 = 1 << 2
	FlagUserRecovery        uint64 = 1 << 3 // keep the device while no server runs
	FlagUserRecoveryReissue uint64 = 1 << 4 // resend what the dead server held
	FlagUnprivilegedDev     uint64 = 1 << 5
	FlagCmdIoctlEncode      uint64 = 1 << 6
	FlagUserCopy            uint64 = 1 << 7
	FlagZoned               uint64 = 1 << 8
	FlagUserRecoveryFailIO  uint64 = 1 << 9
	FlagUpdateSize          uint64 = 1 << 10
	featuresLen                    = 8 // UBLK_FEATURES_LEN
	maxQueueDepth                  = 4096
	maxQueues                      = 4096
	ioResOK                        = 0
	ioResNeedGetData               = 1
	cmdBufOffset                   = 0 // UBLKSRV_CMD_BUF_OFFSET
	maxCmdBufSize                  = maxQueueDepth * ioDescSize
	sectorShift                    = 9
	noQueue                 uint16 = 0xffff // queue_id of a command for no queue
	autoDevID               uint32 = 0xffffffff
)

// Device states (ublksrv_ctrl_dev_info.state).
const (
	StateDead     = 0
	StateLive     = 1
	StateQuiesced = 2 // server gone, I/O queued: recovery may start
	StateFailIO   = 3
)

// I/O operations (the low 8 bits of ublksrv_io_desc.op_flags).
const (
	OpRead        = 0
	OpWrite       = 1
	OpFlush       = 2
	OpDiscard     = 3
	OpWriteSame   = 4
	OpWriteZeroes = 5
)

// I/O flags (op_flags, as the kernel sets them: bit 8 and up).
const (
	IOFlagFUA     = 1 << 13
	IOFlagNoUnmap = 1 << 15
)

// Parameter types and basic attributes (struct ublk_params).
const (
	paramTypeBasic   = 1 << 0
	paramTypeDiscard = 1 << 1

	AttrReadOnly      = 1 << 0
	AttrRotational    = 1 << 1
	AttrVolatileCache = 1 << 2
	AttrFUA           = 1 << 3
)

// Sizes of the kernel's structs, in bytes.
const (
	ctrlCmdSize  = 32 // struct ublksrv_ctrl_cmd
	devInfoSize  = 64 // struct ublksrv_ctrl_dev_info
	ioDescSize   = 24 // struct ublksrv_io_desc
	ioCmdSize    = 16 // struct ublksrv_io_cmd
	basicSize    = 32 // struct ublk_param_basic
	discardSize  = 20 // struct ublk_param_discard
	paramsHeader = 8  // len, types
	// paramsSize is what berth sends: the header, basic and discard. The
	// kernel takes a shorter struct ublk_params than its own (len says how
	// much), so newer parameter types need not be known.
	paramsSize = paramsHeader + basicSize + discardSize
)

// ctrlCmd is struct ublksrv_ctrl_cmd, the 32 bytes in a control SQE's cmd
// area.
type ctrlCmd struct {
	DevID      uint32
	QueueID    uint16
	Len        uint16
	Addr       uint64
	Data       uint64
	DevPathLen uint16
	Pad        uint16
	Reserved   uint32
}

// The control path's structs are encoded by reflection (binary.Encode):
// their Go layout is the kernel's (uapi_test.go), and they are rare.

func (c *ctrlCmd) encode(b []byte) { mustEncode(b, c) }

func decodeCtrlCmd(b []byte) (c ctrlCmd, err error) {
	if _, err = binary.Decode(b, le, &c); err != nil {
		return ctrlCmd{}, fmt.Errorf("ublk: control command: %w", err)
	}
	return c, nil
}

func mustEncode(b []byte, v any) {
	if _, err := binary.Encode(b, le, v); err != nil {
		panic(err) // a buffer smaller than a fixed-size struct: a bug here
	}
}

// DevInfo is struct ublksrv_ctrl_dev_info: what ADD_DEV asks for and the
// kernel answers (with the flags it granted), and what GET_DEV_INFO tells.
type DevInfo struct {
	NrHWQueues    uint16
	QueueDepth    uint16
	State         uint16
	Pad0          uint16
	MaxIOBufBytes uint32
	DevID         uint32
	ServerPID     int32
	Pad1          uint32
	Flags         uint64
	ServerFlags   uint64 // ublksrv_flags: the server's own, the kernel keeps them
	OwnerUID      uint32
	OwnerGID      uint32
	Reserved1     uint64
	Reserved2     uint64
}

func (d *DevInfo) encode(b []byte) { mustEncode(b, d) }

// DecodeDevInfo parses the kernel's struct ublksrv_ctrl_dev_info and checks
// what a server relies on: a queue count and depth within the driver's
// limits.
func DecodeDevInfo(b []byte) (DevInfo, error) {
	var d DevInfo
	if _, err := binary.Decode(b, le, &d); err != nil {
		return DevInfo{}, fmt.Errorf("ublk: device info: %w", err)
	}
	switch {
	case d.NrHWQueues == 0 || d.NrHWQueues > maxQueues:
		return d, fmt.Errorf("ublk: device info: %d queues (1 to %d)", d.NrHWQueues, maxQueues)
	case d.QueueDepth == 0 || d.QueueDepth > maxQueueDepth:
		return d, fmt.Errorf("ublk: device info: queue depth %d (1 to %d)", d.QueueDepth, maxQueueDepth)
	}
	return d, nil
}

// Params is what SET_PARAMS sends: struct ublk_params with its basic and
// discard parts (ublk_param_basic, ublk_param_discard).
type Params struct {
	// Attrs: Attr* bits.
	Attrs uint32
	// LogicalBSShift and PhysicalBSShift: log2 of the block sizes (9 to
	// the page shift); IOOptShift, IOMinShift: log2 of the optimal and
	// minimum I/O sizes.
	LogicalBSShift  uint8
	PhysicalBSShift uint8
	IOOptShift      uint8
	IOMinShift      uint8
	// MaxSectors: the largest request, in 512-byte sectors; at most the
	// device's MaxIOBufBytes/512.
	MaxSectors   uint32
	ChunkSectors uint32
	// DevSectors: the device size in 512-byte sectors.
	DevSectors       uint64
	VirtBoundaryMask uint64

	// Discard: when DiscardGranularity is 0 the device takes no discards
	// (no discard parameters are sent).
	DiscardAlignment      uint32
	DiscardGranularity    uint32
	MaxDiscardSectors     uint32
	MaxWriteZeroesSectors uint32
	MaxDiscardSegments    uint16
}

// encode writes struct ublk_params (header, basic, discard) into b.
func (p *Params) encode(b []byte) {
	_ = b[paramsSize-1]
	clear(b[:paramsSize])
	types := uint32(paramTypeBasic)
	if p.DiscardGranularity != 0 {
		types |= paramTypeDiscard
	}
	le.PutUint32(b[0:], paramsSize)
	le.PutUint32(b[4:], types)
	bb := b[paramsHeader:]
	le.PutUint32(bb[0:], p.Attrs)
	bb[4], bb[5], bb[6], bb[7] = p.LogicalBSShift, p.PhysicalBSShift, p.IOOptShift, p.IOMinShift
	le.PutUint32(bb[8:], p.MaxSectors)
	le.PutUint32(bb[12:], p.ChunkSectors)
	le.PutUint64(bb[16:], p.DevSectors)
	le.PutUint64(bb[24:], p.VirtBoundaryMask)
	if types&paramTypeDiscard != 0 {
		db := b[paramsHeader+basicSize:]
		le.PutUint32(db[0:], p.DiscardAlignment)
		le.PutUint32(db[4:], p.DiscardGranularity)
		le.PutUint32(db[8:], p.MaxDiscardSectors)
		le.PutUint32(db[12:], p.MaxWriteZeroesSectors)
		le.PutUint16(db[16:], p.MaxDiscardSegments)
	}
}

// IODesc is struct ublksrv_io_desc: one request as the kernel describes it
// in the queue's descriptor area (mmap of /dev/ublkcN), indexed by tag.
type IODesc struct {
	OpFlags     uint32 // op in bits 0-7, flags above
	NrSectors   uint32
	StartSector uint64
	Addr        uint64 // the server's buffer for this tag
}

// Op is the request's operation (Op*).
func (d IODesc) Op() uint8 { return uint8(d.OpFlags) }

// Flags are the request's flags (IOFlag*), in op_flags' bit positions.
func (d IODesc) Flags() uint32 { return d.OpFlags &^ 0xff }

// DecodeIODesc parses one struct ublksrv_io_desc.
func DecodeIODesc(b []byte) (IODesc, error) {
	if len(b) < ioDescSize {
		return IODesc{}, fmt.Errorf("ublk: I/O descriptor: %d bytes, want %d", len(b), ioDescSize)
	}
	return IODesc{
		OpFlags: le.Uint32(b[0:]), NrSectors: le.Uint32(b[4:]),
		StartSector: le.Uint64(b[8:]), Addr: le.Uint64(b[16:]),
	}, nil
}

// Range returns the request's byte offset and length, checked against
// the device (size bytes) and the tag's buffer (bufSize bytes, for reads
// and writes, whose data pass through it). A request the kernel should
// never send, out of range or too large, is an error: serving it would
// touch memory or image bytes it does not own.
func (d IODesc) Range(size int64, bufSize int) (off, n int64, err error) {
	const maxSector = 1<<(63-sectorShift) - 1
	if d.StartSector > maxSector {
		return 0, 0, fmt.Errorf("ublk: request at sector %d: beyond any device", d.StartSector)
	}
	off, n = int64(d.StartSector)<<sectorShift, int64(d.NrSectors)<<sectorShift
	if off > size || n > size-off {
		return 0, 0, fmt.Errorf("ublk: request %d+%d beyond the %d-byte device", off, n, size)
	}
	if op := d.Op(); (op == OpRead || op == OpWrite) && n > int64(bufSize) {
		return 0, 0, fmt.Errorf("ublk: request of %d bytes beyond the %d-byte buffer", n, bufSize)
	}
	return off, n, nil
}

// ioCmd is struct ublksrv_io_cmd, the 16 bytes in an I/O SQE's cmd area.
type ioCmd struct {
	QID    uint16
	Tag    uint16
	Result int32
	Addr   uint64
}

func (c *ioCmd) encode(b []byte) {
	_ = b[ioCmdSize-1]
	le.PutUint16(b[0:], c.QID)
	le.PutUint16(b[2:], c.Tag)
	le.PutUint32(b[4:], uint32(c.Result))
	le.PutUint64(b[8:], c.Addr)
}

// cmdBufSize is the size of one queue's descriptor area: depth
// descriptors, rounded up to whole pages (ublk_queue_cmd_buf_size).
func cmdBufSize(depth, pageSize int) int {
	return roundUp(depth*ioDescSize, pageSize)
}

// cmdBufOffset is the mmap offset of queue q's descriptor area: each queue
// has room for the largest depth (ublk_max_cmd_buf_size).
func cmdBufOff(q, pageSize int) int64 {
	return cmdBufOffset + int64(q)*int64(roundUp(maxCmdBufSize, pageSize))
}

func roundUp(n, to int) int { return (n + to - 1) / to * to }
