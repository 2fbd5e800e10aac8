// Package nbd serves a volume image to the kernel's nbd driver: the NBD
// transmission phase over sockets handed to the kernel through generic
// netlink, and reconnection of a device whose server died.
package nbd

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// Wire constants of the NBD transmission phase (the kernel skips the
// handshake: it gets the socket after negotiation).
const (
	requestMagic = 0x25609513
	replyMagic   = 0x67446698

	requestSize = 28
	replySize   = 16
)

// Commands (the low 16 bits of the request's type word).
const (
	cmdRead        = 0
	cmdWrite       = 1
	cmdDisc        = 2
	cmdFlush       = 3
	cmdTrim        = 4
	cmdCache       = 5
	cmdWriteZeroes = 6
)

// Command flags (the high 16 bits of the type word: the kernel sends
// type|NBD_CMD_FLAG_FUA with NBD_CMD_FLAG_FUA = 1<<16, big endian).
const (
	cmdFlagFUA    = 1 << 0
	cmdFlagNoHole = 1 << 1
)

// Transmission flags: what the server tells the kernel it supports.
const (
	flagHasFlags        = 1 << 0
	flagReadOnly        = 1 << 1
	flagSendFlush       = 1 << 2
	flagSendFUA         = 1 << 3
	flagSendTrim        = 1 << 5
	flagSendWriteZeroes = 1 << 6
	flagCanMultiConn    = 1 << 8
)

// serverFlags is what Serve implements. Multi-conn is safe: every
// connection serves the same image and FLUSH syncs the whole file.
const serverFlags = flagHasFlags | flagSendFlush | flagSendFUA | flagSendTrim |
	flagSendWriteZeroes | flagCanMultiConn

// Error values on the wire (the protocol's errno numbers, doc/proto.md
// "Error values"). The kernel fails the request with an I/O error whatever
// the value; the distinctions matter to other clients and to logs.
const (
	errnoOK    = 0
	errnoIO    = 5
	errnoInval = 22
	errnoNoSpc = 28
)

// maxPayload bounds one request's data; the kernel sends at most 32 MiB
// (max_hw_sectors 65536).
const maxPayload = 32 << 20

// request is one decoded request header.
type request struct {
	flags  uint16
	cmd    uint16
	cookie uint64
	off    uint64
	length uint32
}

var errBadMagic = errors.New("nbd: bad request magic")

func parseRequest(b []byte) (request, error) {
	if len(b) < requestSize {
		return request{}, fmt.Errorf("nbd: request header of %d bytes, want %d", len(b), requestSize)
	}
	if m := binary.BigEndian.Uint32(b[0:4]); m != requestMagic {
		return request{}, fmt.Errorf("%w %#x", errBadMagic, m)
	}
	return request{
		flags:  binary.BigEndian.Uint16(b[4:6]),
		cmd:    binary.BigEndian.Uint16(b[6:8]),
		cookie: binary.BigEndian.Uint64(b[8:16]),
		off:    binary.BigEndian.Uint64(b[16:24]),
		length: binary.BigEndian.Uint32(b[24:28]),
	}, nil
}

func putRequest(b []byte, r request) {
	binary.BigEndian.PutUint32(b[0:4], requestMagic)
	binary.BigEndian.PutUint16(b[4:6], r.flags)
	binary.BigEndian.PutUint16(b[6:8], r.cmd)
	binary.BigEndian.PutUint64(b[8:16], r.cookie)
	binary.BigEndian.PutUint64(b[16:24], r.off)
	binary.BigEndian.PutUint32(b[24:28], r.length)
}

func putReply(b []byte, errno uint32, cookie uint64) {
	binary.BigEndian.PutUint32(b[0:4], replyMagic)
	binary.BigEndian.PutUint32(b[4:8], errno)
	binary.BigEndian.PutUint64(b[8:16], cookie)
}

// reply is one decoded reply header.
type reply struct {
	errno  uint32
	cookie uint64
}

func parseReply(b []byte) (reply, error) {
	if len(b) < replySize {
		return reply{}, fmt.Errorf("nbd: reply header of %d bytes, want %d", len(b), replySize)
	}
	if m := binary.BigEndian.Uint32(b[0:4]); m != replyMagic {
		return reply{}, fmt.Errorf("nbd: bad reply magic %#x", m)
	}
	return reply{errno: binary.BigEndian.Uint32(b[4:8]), cookie: binary.BigEndian.Uint64(b[8:16])}, nil
}
