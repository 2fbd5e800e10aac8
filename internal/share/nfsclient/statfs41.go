package nfsclient

import (
	"context"
	"fmt"
)

// GETATTR and the space attributes (RFC 7530: space_avail 42, space_total 44).
const (
	opGetAttr       = 9
	fattrSpaceAvail = 42
	fattrSpaceTotal = 44
)

// Space is what a client sees of an export's filesystem size.
type Space struct{ Total, Avail uint64 }

// Statfs41 asks an NFSv4.1+ server for the size of the filesystem behind
// the export (what statfs(2) on a kernel client's mount reports), without
// retrying.
func Statfs41(ctx context.Context, ep Endpoint, minor uint32, machine string) (Space, error) {
	s, err := dial41(ctx, ep.Addr, minor, machine)
	if err != nil {
		return Space{}, err
	}
	defer s.close()
	var e xdrEnc
	nops := lookupOps(&e, ep.Export, 0)
	e.u32(opGetAttr)
	e.u32(2) // bitmap words
	e.u32(0)
	e.u32(1<<(fattrSpaceAvail-32) | 1<<(fattrSpaceTotal-32))
	d, err := s.seq(e.b.Bytes(), nops+1)
	if err != nil {
		return Space{}, fmt.Errorf("GETATTR of %s: %w", ep.Export, err)
	}
	skipOps(d, nops)
	d.u32() // GETATTR
	d.u32() // status
	words := make([]uint32, d.count(4))
	for i := range words {
		words[i] = d.u32()
	}
	attrs := xdrDec{b: d.opaque()}
	if d.err != nil {
		return Space{}, d.err
	}
	var sp Space
	has := func(a int) bool { return len(words) > a/32 && words[a/32]&(1<<(a%32)) != 0 }
	if !has(fattrSpaceAvail) || !has(fattrSpaceTotal) {
		return Space{}, fmt.Errorf("GETATTR of %s: the server returned no space attributes (bitmap %x)", ep.Export, words)
	}
	// Attributes come in the order of their numbers.
	sp.Avail = attrs.u64()
	sp.Total = attrs.u64()
	return sp, attrs.err
}
