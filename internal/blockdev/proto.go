package blockdev

import "encoding/binary"

// The FUSE kernel protocol (include/uapi/linux/fuse.h), only the parts a
// one-file file system needs. Written out here because the server loop is
// ours: it must start on a connection whose INIT another process answered.

const (
	protoMajor = 7
	// protoMinor is the newest minor whose structs this file encodes (7.31
	// has max_pages; later minors only append fields we send as zero).
	protoMinor = 40

	rootID = 1 // FUSE_ROOT_ID
	fileID = 2 // the one regular file; constant so a takeover needs no state
	fileFH = 1 // the one file handle, the same in every server
	dirFH  = 2

	// FileName is the file the loop device is attached to.
	FileName = "disk.img"
)

// Opcodes.
const (
	opLookup      = 1
	opForget      = 2
	opGetattr     = 3
	opSetattr     = 4
	opOpen        = 14
	opRead        = 15
	opWrite       = 16
	opStatfs      = 17
	opRelease     = 18
	opFsync       = 20
	opFlush       = 25
	opInit        = 26
	opOpendir     = 27
	opReaddir     = 28
	opReleasedir  = 29
	opFsyncdir    = 30
	opInterrupt   = 36
	opDestroy     = 38
	opBatchForget = 42
	opFallocate   = 43
)

// Init flags (fuse_init_in/out.flags, flags2 shifted by 32).
const (
	initAsyncRead  = 1 << 0
	initBigWrites  = 1 << 5
	initAsyncDIO   = 1 << 15
	initMaxPages   = 1 << 22
	initExt        = 1 << 30
	initPassthru   = 1 << 37
	initHasResend  = 1 << 39
	notifyResend   = 7
	uniqueResend   = 1 << 63 // set by the kernel on resent requests
	fopenDirectIO  = 1 << 0
	fopenParallelW = 1 << 6 // FOPEN_PARALLEL_DIRECT_WRITES
	fopenPassthru  = 1 << 7
	fattrSize      = 1 << 3
)

const (
	inHeaderSize  = 40
	outHeaderSize = 16
	writeInSize   = 40
	attrSize      = 88
)

var le = binary.LittleEndian

// inHeader is fuse_in_header.
type inHeader struct {
	length uint32
	opcode uint32
	unique uint64
	nodeID uint64
}

func parseInHeader(b []byte) inHeader {
	return inHeader{
		length: le.Uint32(b[0:]),
		opcode: le.Uint32(b[4:]),
		unique: le.Uint64(b[8:]),
		nodeID: le.Uint64(b[16:]),
	}
}

// putOutHeader writes fuse_out_header; errno is positive (sent negated).
func putOutHeader(b []byte, length int, errno int32, unique uint64) {
	le.PutUint32(b[0:], uint32(length))
	le.PutUint32(b[4:], uint32(-errno))
	le.PutUint64(b[8:], unique)
}

// attr is what fuse_attr carries for our two nodes.
type attr struct {
	ino   uint64
	size  uint64
	mode  uint32
	nlink uint32
	mtime uint64
}

func putAttr(b []byte, a attr) {
	clear(b[:attrSize])
	le.PutUint64(b[0:], a.ino)
	le.PutUint64(b[8:], a.size)
	le.PutUint64(b[16:], (a.size+511)/512)
	le.PutUint64(b[24:], a.mtime) // atime
	le.PutUint64(b[32:], a.mtime)
	le.PutUint64(b[40:], a.mtime) // ctime
	le.PutUint32(b[60:], a.mode)
	le.PutUint32(b[64:], a.nlink)
	le.PutUint32(b[80:], 4096) // blksize
}

// initIn is the part of fuse_init_in we use.
type initIn struct {
	Major        uint32 `json:"major"`
	Minor        uint32 `json:"minor"`
	MaxReadahead uint32 `json:"maxReadahead"`
	Flags        uint64 `json:"flags"`
}

func parseInitIn(b []byte) initIn {
	in := initIn{Major: le.Uint32(b[0:]), Minor: le.Uint32(b[4:]), MaxReadahead: le.Uint32(b[8:]), Flags: uint64(le.Uint32(b[12:]))}
	if len(b) >= 20 && in.Flags&initExt != 0 {
		in.Flags |= uint64(le.Uint32(b[16:])) << 32
	}
	return in
}

// initOut is fuse_init_out.
type initOut struct {
	Major               uint32 `json:"major"`
	Minor               uint32 `json:"minor"`
	MaxReadahead        uint32 `json:"maxReadahead"`
	Flags               uint64 `json:"flags"`
	MaxBackground       uint16 `json:"maxBackground"`
	CongestionThreshold uint16 `json:"congestionThreshold"`
	MaxWrite            uint32 `json:"maxWrite"`
	TimeGran            uint32 `json:"timeGran"`
	MaxPages            uint16 `json:"maxPages"`
	MaxStackDepth       uint32 `json:"maxStackDepth,omitempty"`
}

// initOutSize is the reply size for a kernel speaking minor: older kernels
// expect the short struct.
func initOutSize(minor uint32) int {
	if minor < 23 {
		return 24
	}
	return 64
}

func putInitOut(b []byte, o initOut) {
	clear(b[:64])
	le.PutUint32(b[0:], o.Major)
	le.PutUint32(b[4:], o.Minor)
	le.PutUint32(b[8:], o.MaxReadahead)
	le.PutUint32(b[12:], uint32(o.Flags))
	le.PutUint16(b[16:], o.MaxBackground)
	le.PutUint16(b[18:], o.CongestionThreshold)
	le.PutUint32(b[20:], o.MaxWrite)
	le.PutUint32(b[24:], o.TimeGran)
	le.PutUint16(b[28:], o.MaxPages)
	le.PutUint32(b[32:], uint32(o.Flags>>32))
	le.PutUint32(b[36:], o.MaxStackDepth)
}
