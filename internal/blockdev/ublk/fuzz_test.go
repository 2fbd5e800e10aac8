package ublk

import (
	"bytes"
	"testing"
)

// FuzzKernelDescriptors feeds what the kernel writes and a server parses:
// a device info (ADD_DEV, GET_DEV_INFO) and a request's descriptor, which
// is then served on an image that fails the test on any access outside it.
// The seeds (testdata/fuzz) are the shapes the driver sends.
func FuzzKernelDescriptors(f *testing.F) {
	info := make([]byte, devInfoSize)
	(&DevInfo{NrHWQueues: 1, QueueDepth: 128, MaxIOBufBytes: 512 << 10, DevID: 3, ServerPID: -1,
		Flags: FlagUserRecovery | FlagUserRecoveryReissue | FlagCmdIoctlEncode}).encode(info)
	for _, d := range []IODesc{
		{OpFlags: OpRead, NrSectors: 8},
		{OpFlags: OpWrite | IOFlagFUA, StartSector: 120, NrSectors: 8},
		{OpFlags: OpDiscard, NrSectors: 128},
		{OpFlags: OpWriteZeroes | IOFlagNoUnmap, StartSector: 8, NrSectors: 64},
	} {
		b := make([]byte, ioDescSize)
		mustEncode(b, d)
		f.Add(append(append([]byte(nil), info...), b...))
	}
	const size, bufSize = 64 << 10, 16 << 10
	f.Fuzz(func(t *testing.T, data []byte) {
		info, err := DecodeDevInfo(data)
		if err == nil {
			if info.NrHWQueues == 0 || info.QueueDepth == 0 || info.QueueDepth > maxQueueDepth {
				t.Fatalf("accepted %+v", info)
			}
			back := make([]byte, devInfoSize)
			info.encode(back)
			if !bytes.Equal(back, data[:devInfoSize]) {
				t.Fatalf("dev info does not round-trip: %x -> %x", data[:devInfoSize], back)
			}
		}
		rest := data[min(len(data), devInfoSize):]
		d, err := DecodeIODesc(rest)
		if err != nil {
			return
		}
		back := make([]byte, ioDescSize)
		mustEncode(back, d)
		if !bytes.Equal(back, rest[:ioDescSize]) {
			t.Fatalf("descriptor does not round-trip: %x -> %x", rest[:ioDescSize], back)
		}
		off, n, err := d.Range(size, bufSize)
		if err == nil && (off < 0 || n < 0 || off+n > size) {
			t.Fatalf("Range(%+v) = %d, %d: outside the device", d, off, n)
		}
		img := &memImage{t: t, data: make([]byte, size)}
		serveRequest(img, d, make([]byte, bufSize), size)
	})
}
