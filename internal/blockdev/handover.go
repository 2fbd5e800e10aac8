package blockdev

import (
	"encoding/json"
	"fmt"
)

// Settings is what the first server negotiated in INIT. The kernel sends INIT
// once per connection, so a server taking a connection over gets no INIT and
// must replay these instead; the keeper stores them as opaque bytes.
type Settings struct {
	In  initIn  `json:"in"`
	Out initOut `json:"out"`
	// BackingID is the image registered for passthrough on this
	// connection (0: none yet); it lives as long as the connection.
	BackingID int32 `json:"backingID,omitempty"`
}

// Passthrough says whether the kernel does reads and writes on the image
// itself (FUSE passthrough, 6.9+), bypassing the server.
func (s Settings) Passthrough() bool { return s.Out.Flags&initPassthru != 0 }

// Marshal encodes settings for the keeper.
func (s Settings) Marshal() ([]byte, error) {
	return json.Marshal(s)
}

// ParseSettings decodes what Marshal produced; empty input means none saved.
func ParseSettings(b []byte) (*Settings, error) {
	if len(b) == 0 {
		return nil, nil
	}
	var s Settings
	if err := json.Unmarshal(b, &s); err != nil {
		return nil, fmt.Errorf("parse saved INIT settings: %w", err)
	}
	// A larger max write than this server's buffers would lose requests.
	if s.Out.Major != protoMajor || s.Out.MaxWrite == 0 || s.Out.MaxWrite > maxWrite {
		return nil, fmt.Errorf("saved INIT settings are not usable: %+v", s.Out)
	}
	return &s, nil
}

// KernelResends says whether the kernel announced FUSE_NOTIFY_RESEND support.
func (s Settings) KernelResends() bool { return s.In.Flags&initHasResend != 0 }

const (
	// maxWrite is the largest max write a connection may carry, which the
	// buffers hold: 1 MiB, what servers before negotiated (one request per
	// large block I/O of the loop device), so they can still be taken over.
	maxWrite = 1 << 20
	// initMaxWrite is what a server negotiates now: half a MiB, so that a
	// WRITE and its headers fit a pipe of fs.pipe-max-size (1 MiB by
	// default), which splice needs (requests.go); larger I/O of the loop
	// device is split in two requests.
	initMaxWrite    = 512 << 10
	negotiatedPages = initMaxWrite / 4096
	// maxBackground bounds the async direct I/O requests in flight; the
	// kernel default (12) would cap the loop device's queue depth.
	maxBackground       = 256
	congestionThreshold = 192
)

// negotiate is the reply to INIT. It depends only on what the kernel offers,
// so a server that re-answers a resent INIT gives the same answer.
func negotiate(in initIn, passthrough bool) Settings {
	want := uint64(initAsyncRead | initBigWrites | initAsyncDIO | initMaxPages)
	var depth uint32
	if passthrough && in.Flags&initPassthru != 0 {
		// INIT_EXT makes the kernel read flags2, where passthrough is;
		// depth 1: the image's file system stacks under this one.
		want |= initPassthru | initExt
		depth = 1
	}
	minor := min(in.Minor, protoMinor)
	return Settings{In: in, Out: initOut{
		Major:               protoMajor,
		Minor:               minor,
		MaxReadahead:        in.MaxReadahead,
		Flags:               in.Flags & want,
		MaxBackground:       maxBackground,
		CongestionThreshold: congestionThreshold,
		MaxWrite:            initMaxWrite,
		TimeGran:            1,
		MaxPages:            negotiatedPages,
		MaxStackDepth:       depth,
	}}
}
