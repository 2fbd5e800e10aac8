package nfsclient

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"path"
	"time"

	"k8s.io/utils/clock"
)

// More NFSv4.1 operations the probe uses (RFC 5661).
const (
	opClose          = 4
	opCommit         = 5
	opGetFH          = 10
	opOpen           = 18
	opPutFH          = 22
	opRead           = 25
	opRemove         = 28
	opWrite          = 38
	opReclaimComplet = 58

	fattrSize = 4
	fattrMode = 33

	probeChunk = 256 << 10
)

// ErrVerifierChanged: the server restarted between the WRITEs and the
// COMMIT, so unstable data may be gone; the caller writes again.
var ErrVerifierChanged = errors.New("write verifier changed before COMMIT: the server restarted")

// WriteCommitRead41 writes data as file name in the export over one
// NFSv4.1+ session with unstable WRITEs, COMMITs them (the NFS fsync),
// checks that the write verifier held, reads the file back and returns it,
// without retrying: ProbeFile41 retries.
func WriteCommitRead41(ctx context.Context, ep Endpoint, name string, data []byte, minor uint32, machine string) ([]byte, error) {
	s, full, stateid, fh, err := openFile41(ctx, ep, name, minor, machine, true)
	if err != nil {
		return nil, err
	}
	defer s.close()
	var verf []byte
	for off := 0; off < len(data); {
		chunk := data[off:min(off+probeChunk, len(data))]
		var e xdrEnc
		putFH(&e, fh)
		e.u32(opWrite)
		e.fixed(stateid)
		e.u64(uint64(off))
		e.u32(0) // UNSTABLE4: COMMIT makes it durable
		e.opaque(chunk)
		d, err := s.seq(e.b.Bytes(), 2)
		if err != nil {
			return nil, fmt.Errorf("write %s at %d: %w", full, off, err)
		}
		skipOps(d, 1)
		d.u32()
		d.u32()
		count := d.u32()
		d.u32() // how stable
		v := bytes.Clone(d.fixed(8))
		if d.err != nil {
			return nil, d.err
		}
		if count == 0 {
			return nil, fmt.Errorf("write %s at %d: server wrote nothing", full, off)
		}
		if verf != nil && !bytes.Equal(v, verf) {
			return nil, ErrVerifierChanged
		}
		verf = v
		off += int(count)
	}
	var e xdrEnc
	putFH(&e, fh)
	e.u32(opCommit)
	e.u64(0)
	e.u32(0) // to the end of the file
	d, err := s.seq(e.b.Bytes(), 2)
	if err != nil {
		return nil, fmt.Errorf("commit %s: %w", full, err)
	}
	skipOps(d, 1)
	d.u32()
	d.u32()
	if v := d.fixed(8); d.err == nil && verf != nil && !bytes.Equal(v, verf) {
		return nil, ErrVerifierChanged
	}

	got, err := s.readAll(full, fh, stateid)
	if err != nil {
		return nil, err
	}
	return got, s.closeFile(full, fh, stateid)
}

// openFile41 opens a session to ep and in it the file name (made when
// create); the caller closes the session.
func openFile41(ctx context.Context, ep Endpoint, name string, minor uint32, machine string, create bool) (s *session41, full string, stateid, fh []byte, err error) {
	if full, err = ep.path(name); err != nil {
		return nil, "", nil, nil, err
	}
	if s, err = dial41(ctx, ep.Addr, minor, machine); err != nil {
		return nil, "", nil, nil, err
	}
	s.reclaimComplete()
	if stateid, fh, err = s.openFile(full, create); err != nil {
		s.close()
		return nil, "", nil, nil, err
	}
	return s, full, stateid, fh, nil
}

// ReadFile41 reads name from the export over NFSv4.1+, without retrying.
func ReadFile41(ctx context.Context, ep Endpoint, name string, minor uint32, machine string) ([]byte, error) {
	s, full, stateid, fh, err := openFile41(ctx, ep, name, minor, machine, false)
	if err != nil {
		return nil, err
	}
	defer s.close()
	got, err := s.readAll(full, fh, stateid)
	if err != nil {
		return nil, err
	}
	return got, s.closeFile(full, fh, stateid)
}

// reclaimComplete tells the server this new client has nothing to reclaim;
// NFS4ERR_COMPLETE_ALREADY and the like change nothing for it.
func (s *session41) reclaimComplete() {
	var e xdrEnc
	e.u32(opReclaimComplet)
	e.u32(0) // for every filesystem
	_, _ = s.seq(e.b.Bytes(), 1)
}

// openFile opens full for reading and writing, created or truncated when
// create, else as it is, and returns the open's stateid and file handle.
func (s *session41) openFile(full string, create bool) (stateid, fh []byte, err error) {
	var e xdrEnc
	n := lookupOps(&e, full, 1)
	e.u32(opOpen)
	e.u32(0) // seqid, unused in 4.1
	e.u32(3) // share access: read and write
	e.u32(0) // deny nothing
	e.u64(s.clientID)
	e.opaque([]byte("berth-probe"))
	if create {
		e.u32(1) // OPEN4_CREATE
		e.u32(0) // UNCHECKED4: truncate an existing file
		e.u32(2) // bitmap: size and mode
		e.u32(1 << fattrSize)
		e.u32(1 << (fattrMode - 32))
		var attrs xdrEnc
		attrs.u64(0)
		attrs.u32(0o600)
		e.opaque(attrs.b.Bytes())
	} else {
		e.u32(0) // OPEN4_NOCREATE
	}
	e.u32(0) // CLAIM_NULL
	e.opaque([]byte(path.Base(full)))
	e.u32(opGetFH)
	d, err := s.seq(e.b.Bytes(), n+2)
	if err != nil {
		return nil, nil, fmt.Errorf("open %s: %w", full, err)
	}
	skipOps(d, n)
	d.u32()
	d.u32() // OPEN result header
	stateid = bytes.Clone(d.fixed(16))
	d.fixed(20) // change info
	d.u32()     // flags
	for i := d.u32(); i > 0 && d.err == nil; i-- {
		d.u32() // attributes set
	}
	if deleg := d.u32(); d.err == nil && deleg != 0 {
		return nil, nil, fmt.Errorf("open %s: delegation type %d was not asked for", full, deleg)
	}
	d.u32()
	d.u32() // GETFH result header
	fh = bytes.Clone(d.opaque())
	if d.err != nil {
		return nil, nil, d.err
	}
	return stateid, fh, nil
}

// readAll reads the open file fh from its start to its end.
func (s *session41) readAll(full string, fh, stateid []byte) ([]byte, error) {
	var got []byte
	for eof := false; !eof; {
		var e xdrEnc
		putFH(&e, fh)
		e.u32(opRead)
		e.fixed(stateid)
		e.u64(uint64(len(got)))
		e.u32(probeChunk)
		d, err := s.seq(e.b.Bytes(), 2)
		if err != nil {
			return nil, fmt.Errorf("read %s at %d: %w", full, len(got), err)
		}
		skipOps(d, 1)
		d.u32()
		d.u32()
		eof = d.u32() != 0
		p := d.opaque()
		if d.err != nil {
			return nil, d.err
		}
		if len(p) == 0 && !eof {
			return nil, fmt.Errorf("read %s at %d: no data and no end of file", full, len(got))
		}
		got = append(got, p...)
	}
	return got, nil
}

func (s *session41) closeFile(full string, fh, stateid []byte) error {
	var e xdrEnc
	putFH(&e, fh)
	e.u32(opClose)
	e.u32(0)
	e.fixed(stateid)
	if _, err := s.seq(e.b.Bytes(), 2); err != nil {
		return fmt.Errorf("close %s: %w", full, err)
	}
	return nil
}

// Remove41 removes name from the export over NFSv4.1+.
func Remove41(ctx context.Context, ep Endpoint, name string, minor uint32, machine string) error {
	full, err := ep.path(name)
	if err != nil {
		return err
	}
	s, err := dial41(ctx, ep.Addr, minor, machine)
	if err != nil {
		return err
	}
	defer s.close()
	var e xdrEnc
	n := lookupOps(&e, full, 1)
	e.u32(opRemove)
	e.opaque([]byte(path.Base(full)))
	if _, err := s.seq(e.b.Bytes(), n+1); err != nil {
		return fmt.Errorf("remove %s: %w", full, err)
	}
	return nil
}

func putFH(e *xdrEnc, fh []byte) {
	e.u32(opPutFH)
	e.opaque(fh)
}

// skipOps passes over n results that carry nothing but their status
// (PUTROOTFH, PUTFH, LOOKUP).
func skipOps(d *xdrDec, n int) {
	for range n {
		d.u32()
		d.u32()
	}
}

// Retry41 runs op, each time on a new session, until it succeeds, fails
// for good or ctx ends: a server restart (connection lost, grace, session
// gone, verifier changed) is waited out, as a kernel client would. Each
// attempt gets at most attemptTimeout (DefaultAttemptTimeout when 0): a
// server that hangs (frozen, its node cut off) answers nothing, and only
// a new connection reaches the server that replaced it, as a kernel
// client's reconnect after its major timeout does.
func Retry41(ctx context.Context, clk clock.Clock, attemptTimeout time.Duration, op func(ctx context.Context) error) error {
	if attemptTimeout <= 0 {
		attemptTimeout = DefaultAttemptTimeout
	}
	wait := 50 * time.Millisecond
	for attempt := 1; ; attempt++ {
		actx, cancel := context.WithTimeout(ctx, attemptTimeout)
		err := op(actx)
		cancel()
		if err == nil || !retryable41(err) {
			return err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("gave up after %d attempts: %w (last error: %w)", attempt, ctx.Err(), err)
		case <-clk.After(wait):
		}
		wait = min(2*wait, time.Second)
	}
}

// DefaultAttemptTimeout bounds one Retry41 attempt by default.
const DefaultAttemptTimeout = 10 * time.Second

func retryable41(err error) bool {
	var st ErrNFSStatus
	if !errors.As(err, &st) {
		return true // the connection or the server went away; ErrVerifierChanged too
	}
	switch st.Status {
	case 10008, 10011, 10013, 10022, 10052, 10078: // DELAY, EXPIRED, GRACE, STALE_CLIENTID, BADSESSION, DEADSESSION
		return true
	}
	return false
}
