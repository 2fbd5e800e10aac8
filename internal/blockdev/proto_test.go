package blockdev

import (
	"testing"
)

func TestNegotiateIsDeterministicAndBounded(t *testing.T) {
	in := initIn{Major: 7, Minor: 45, MaxReadahead: 128 << 10,
		Flags: initAsyncRead | initAsyncDIO | initMaxPages | initBigWrites | 1<<16 | initHasResend}
	a, b := negotiate(in, false), negotiate(in, false)
	if a != b {
		t.Fatal("negotiate differs for the same INIT")
	}
	if a.Out.Minor != protoMinor {
		t.Fatalf("minor = %d, want ours (%d) when the kernel is newer", a.Out.Minor, protoMinor)
	}
	if a.Out.Flags&(1<<16) != 0 {
		t.Fatal("writeback cache accepted: the loop device above has its own cache")
	}
	if a.Out.Flags&initAsyncDIO == 0 || a.Out.MaxWrite != initMaxWrite || a.Out.MaxPages != negotiatedPages {
		t.Fatalf("settings = %+v", a.Out)
	}
	if !a.KernelResends() {
		t.Fatal("resend support not seen in flags2")
	}
	old := negotiate(initIn{Major: 7, Minor: 22}, true)
	if old.Out.Minor != 22 || initOutSize(22) != 24 {
		t.Fatalf("old kernel: %+v", old.Out)
	}
}

func TestSettingsRoundTrip(t *testing.T) {
	s := negotiate(initIn{Major: 7, Minor: 40, Flags: initAsyncDIO | initPassthru | initExt}, true)
	b, err := s.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	got, err := ParseSettings(b)
	if err != nil || *got != s {
		t.Fatalf("round trip = %+v, %v", got, err)
	}
	if none, err := ParseSettings(nil); none != nil || err != nil {
		t.Fatalf("empty = %v, %v", none, err)
	}
	if _, err := ParseSettings([]byte(`{"out":{"major":6}}`)); err == nil {
		t.Fatal("unusable settings accepted")
	}
}

func TestInitEncoding(t *testing.T) {
	var b [64]byte
	le.PutUint32(b[0:], 7)
	le.PutUint32(b[4:], 41)
	le.PutUint32(b[8:], 4096)
	le.PutUint32(b[12:], initAsyncRead|initExt)
	le.PutUint32(b[16:], uint32(initHasResend>>32))
	in := parseInitIn(b[:])
	if in.Minor != 41 || in.Flags&initHasResend == 0 || in.MaxReadahead != 4096 {
		t.Fatalf("parsed %+v", in)
	}
	var out [64]byte
	putInitOut(out[:], initOut{Major: 7, Minor: 40, MaxWrite: 1 << 20, MaxPages: 256, MaxBackground: 256})
	if le.Uint32(out[20:]) != 1<<20 || le.Uint16(out[28:]) != 256 || le.Uint16(out[16:]) != 256 {
		t.Fatal("init_out fields at the wrong offsets")
	}
}
