package nfsclient

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"syscall"
	"time"
)

// CheckExport41 asks an NFSv4.1 (or .2) server whether export answers:
// EXCHANGE_ID, CREATE_SESSION, SEQUENCE + PUTROOTFH + LOOKUP of each
// component, then DESTROY_SESSION and DESTROY_CLIENTID. The wrapped
// library speaks NFSv4.0 only, which a server serving 4.1+ refuses; this
// is the share manager's readiness and health check there. It opens no
// file, so the server records no client for recovery.
func CheckExport41(ctx context.Context, addr, export string, minor uint32, machine string) error {
	s, err := dial41(ctx, addr, minor, machine)
	if err != nil {
		return err
	}
	defer s.close()
	var e xdrEnc
	nops := lookupOps(&e, export, 0)
	if _, err := s.seq(e.b.Bytes(), nops); err != nil {
		return fmt.Errorf("look up %s: %w", export, err)
	}
	return nil
}

// lookupOps appends PUTROOTFH and a LOOKUP per component of p except the
// last skip ones, and returns how many operations it wrote.
func lookupOps(e *xdrEnc, p string, skip int) int {
	e.u32(opPutRootFH)
	n := 1
	comps := strings.FieldsFunc(p, func(r rune) bool { return r == '/' })
	for _, c := range comps[:len(comps)-skip] {
		e.u32(opLookup)
		e.opaque([]byte(c))
		n++
	}
	return n
}

// dial41 connects and opens a session: EXCHANGE_ID, CREATE_SESSION.
func dial41(ctx context.Context, addr string, minor uint32, machine string) (*session41, error) {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	if deadline, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(deadline)
	}
	s := &session41{conn: conn, minor: minor, cred: authSys(machine)}
	s.stop = context.AfterFunc(ctx, func() { _ = conn.SetDeadline(time.Unix(1, 0)) })
	if err := s.open(machine); err != nil {
		s.stop()
		_ = conn.Close()
		return nil, err
	}
	return s, nil
}

func (s *session41) open(machine string) error {
	owner := make([]byte, 8)
	_, _ = rand.Read(owner)
	var verifier [8]byte
	_, _ = rand.Read(verifier[:])
	var e xdrEnc
	e.u32(opExchangeID)
	e.fixed(verifier[:])
	e.opaque([]byte(fmt.Sprintf("berth-%s-%x", machine, owner)))
	e.u32(0) // flags
	e.u32(0) // SP4_NONE
	e.u32(0) // no implementation id
	res, err := s.compound(e.b.Bytes(), 1)
	if err != nil {
		return fmt.Errorf("EXCHANGE_ID: %w", err)
	}
	s.clientID = res.u64()
	seq := res.u32()
	if res.err != nil {
		return res.err
	}
	e = xdrEnc{}
	e.u32(opCreateSession)
	e.u64(s.clientID)
	e.u32(seq)
	e.u32(0)      // flags: no back channel
	for range 2 { // fore and back channel attributes
		for _, v := range []uint32{0, 1 << 20, 1 << 20, 4096, 16, 1} {
			e.u32(v)
		}
		e.u32(0) // no RDMA
	}
	e.u32(0x40000000) // callback program, unused
	e.u32(1)          // one callback security: AUTH_NONE
	e.u32(0)
	res, err = s.compound(e.b.Bytes(), 1)
	if err != nil {
		s.destroyClient()
		return fmt.Errorf("CREATE_SESSION: %w", err)
	}
	copy(s.sessionID[:], res.fixed(16))
	if res.err != nil {
		return res.err
	}
	s.haveSession = true
	return nil
}

// seq sends SEQUENCE followed by ops (nops operations) and returns the
// decoder at the second operation's result (after SEQUENCE's).
func (s *session41) seq(ops []byte, nops int) (*xdrDec, error) {
	s.slotSeq++
	var e xdrEnc
	e.u32(opSequence)
	e.fixed(s.sessionID[:])
	e.u32(s.slotSeq)
	e.u32(0) // slot
	e.u32(0) // highest slot
	e.u32(0) // do not cache
	e.b.Write(ops)
	d, err := s.compound(e.b.Bytes(), nops+1)
	if err != nil {
		return nil, err
	}
	d.fixed(16) // session
	d.u32()
	d.u32()
	d.u32()
	d.u32()
	d.u32() // sequence, slot, highest, target highest, flags
	return d, d.err
}

// NFSv4 operations and RPC constants (RFC 5661, RFC 5531).
const (
	opLookup          = 15
	opPutRootFH       = 24
	opExchangeID      = 42
	opCreateSession   = 43
	opDestroySession  = 44
	opSequence        = 53
	opDestroyClientID = 57

	nfsProgram  = 100003
	nfsVersion  = 4
	procCompund = 1
	authSysFlav = 1
)

// ErrNFSStatus is a compound that the server answered with an error.
type ErrNFSStatus struct{ Status uint32 }

func (e ErrNFSStatus) Error() string {
	if errno := e.Unwrap(); errno != nil {
		return fmt.Sprintf("NFS status %d: %v", e.Status, errno)
	}
	return fmt.Sprintf("NFS status %d", e.Status)
}

// Unwrap gives the errno of the statuses that RFC 7530 numbers like
// Linux's errnos, so that errors.Is(err, syscall.ENOSPC) works and the
// message says "no space left on device".
func (e ErrNFSStatus) Unwrap() error {
	switch errno := syscall.Errno(e.Status); errno {
	case syscall.EPERM, syscall.ENOENT, syscall.EIO, syscall.ENXIO, syscall.EACCES, syscall.EEXIST,
		syscall.ENOTDIR, syscall.EISDIR, syscall.EINVAL, syscall.EFBIG, syscall.ENOSPC, syscall.EROFS,
		syscall.EMLINK, syscall.ENAMETOOLONG, syscall.ENOTEMPTY, syscall.EDQUOT:
		return errno
	}
	return nil
}

type session41 struct {
	conn        net.Conn
	stop        func() bool
	minor       uint32
	cred        []byte
	xid         uint32
	clientID    uint64
	sessionID   [16]byte
	haveSession bool
	slotSeq     uint32
}

// close ends the session and the client ID, so the server forgets this
// client at once instead of after a lease, and closes the connection.
func (s *session41) close() {
	if s.haveSession {
		var e xdrEnc
		e.u32(opDestroySession)
		e.fixed(s.sessionID[:])
		_, _ = s.compound(e.b.Bytes(), 1)
	}
	s.destroyClient()
	s.stop()
	_ = s.conn.Close()
}

func (s *session41) destroyClient() {
	var e xdrEnc
	e.u32(opDestroyClientID)
	e.u64(s.clientID)
	_, _ = s.compound(e.b.Bytes(), 1)
}

// compound sends one COMPOUND of nops operations and returns a decoder
// positioned at the first operation's result body, or the error status.
func (s *session41) compound(ops []byte, nops int) (*xdrDec, error) {
	s.xid++
	var e xdrEnc
	e.u32(s.xid)
	e.u32(0) // CALL
	e.u32(2) // RPC version
	e.u32(nfsProgram)
	e.u32(nfsVersion)
	e.u32(procCompund)
	e.u32(authSysFlav)
	e.opaque(s.cred)
	e.u32(0) // verifier AUTH_NONE
	e.u32(0)
	e.opaque(nil) // tag
	e.u32(s.minor)
	e.u32(uint32(nops))
	e.b.Write(ops)
	if err := writeRecord(s.conn, e.b.Bytes()); err != nil {
		return nil, err
	}
	reply, err := readRecord(s.conn)
	if err != nil {
		return nil, err
	}
	d := &xdrDec{b: reply}
	if xid := d.u32(); xid != s.xid {
		return nil, fmt.Errorf("reply to xid %d, sent %d", xid, s.xid)
	}
	if mtype, stat := d.u32(), d.u32(); mtype != 1 || stat != 0 {
		return nil, fmt.Errorf("RPC call denied (type %d, status %d)", mtype, stat)
	}
	d.u32()    // verifier flavor
	d.opaque() // verifier body
	if accept := d.u32(); accept != 0 {
		return nil, fmt.Errorf("RPC call not accepted: status %d", accept)
	}
	status := d.u32()
	d.opaque() // tag
	d.u32()    // results
	d.u32()    // first operation
	if first := d.u32(); d.err == nil && status == 0 && first != 0 {
		status = first
	}
	if d.err != nil {
		return nil, d.err
	}
	if status != 0 {
		return nil, ErrNFSStatus{Status: status}
	}
	return d, nil
}

func authSys(machine string) []byte {
	if len(machine) > 255 {
		machine = machine[:255]
	}
	var e xdrEnc
	e.u32(uint32(time.Now().Unix()))
	e.opaque([]byte(machine))
	e.u32(0) // uid root
	e.u32(0) // gid root
	e.u32(0) // no more groups
	return e.b.Bytes()
}

// writeRecord sends msg as one RPC record (RFC 5531 record marking).
func writeRecord(w io.Writer, msg []byte) error {
	buf := make([]byte, 4+len(msg))
	binary.BigEndian.PutUint32(buf, 0x80000000|uint32(len(msg)))
	copy(buf[4:], msg)
	_, err := w.Write(buf)
	return err
}

// readRecord reads one RPC record of one or more fragments.
func readRecord(r io.Reader) ([]byte, error) {
	var out []byte
	for {
		var hdr [4]byte
		if _, err := io.ReadFull(r, hdr[:]); err != nil {
			return nil, err
		}
		h := binary.BigEndian.Uint32(hdr[:])
		n := h & 0x7fffffff
		if len(out)+int(n) > 4<<20 {
			return nil, errors.New("RPC reply larger than 4 MiB")
		}
		frag := make([]byte, n)
		if _, err := io.ReadFull(r, frag); err != nil {
			return nil, err
		}
		out = append(out, frag...)
		if h&0x80000000 != 0 {
			return out, nil
		}
	}
}

type xdrEnc struct{ b bytes.Buffer }

func (e *xdrEnc) u32(v uint32) { _ = binary.Write(&e.b, binary.BigEndian, v) }
func (e *xdrEnc) u64(v uint64) { _ = binary.Write(&e.b, binary.BigEndian, v) }
func (e *xdrEnc) fixed(p []byte) {
	e.b.Write(p)
	e.b.Write(make([]byte, (4-len(p)%4)%4))
}
func (e *xdrEnc) opaque(p []byte) {
	e.u32(uint32(len(p)))
	e.fixed(p)
}

// xdrDec reads XDR; the first short read sets err and every later read
// returns zeros. Nothing it returns is larger than the reply: lengths come
// from the wire, and a short reply claiming 4 GiB must not get them.
type xdrDec struct {
	b   []byte
	err error
}

// take returns the next n bytes, or nil when the reply holds fewer.
func (d *xdrDec) take(n int) []byte {
	if d.err != nil || n > len(d.b) || n < 0 {
		if d.err == nil {
			d.err = errors.New("short NFS reply")
		}
		return nil
	}
	p := d.b[:n]
	d.b = d.b[n:]
	return p
}
func (d *xdrDec) u32() uint32 {
	if p := d.take(4); p != nil {
		return binary.BigEndian.Uint32(p)
	}
	return 0
}
func (d *xdrDec) u64() uint64 {
	if p := d.take(8); p != nil {
		return binary.BigEndian.Uint64(p)
	}
	return 0
}
func (d *xdrDec) fixed(n int) []byte {
	p := d.take(n)
	d.take((4 - n%4) % 4)
	return p
}

// opaque reads a length and that many bytes; a length beyond the reply's
// end (up to 4 GiB on a 32-bit field) is a short reply at once.
func (d *xdrDec) opaque() []byte {
	n := d.u32()
	if uint64(n) > uint64(len(d.b)) {
		d.take(len(d.b) + 1)
		return nil
	}
	return d.fixed(int(n))
}

// count reads a length of items of at least size bytes each, 0 (and a
// short reply) when the rest of the reply cannot hold that many: a
// caller allocates by it.
func (d *xdrDec) count(size int) int {
	n := d.u32()
	if uint64(n)*uint64(size) > uint64(len(d.b)) {
		d.take(len(d.b) + 1)
		return 0
	}
	return int(n)
}
