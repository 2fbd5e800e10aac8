package nbd

import (
	"math/bits"
	"sync"
)

// Buffers come from pools by power-of-two size class, so that a busy
// connection does not allocate per request.
const (
	minClass = 12 // 4 KiB
	maxClass = 26 // 64 MiB: a 32 MiB payload plus its reply header's page fits
)

var pools [maxClass + 1]sync.Pool

func class(n int) int {
	if n <= 1<<minClass {
		return minClass
	}
	return bits.Len(uint(n - 1))
}

// getBuf returns a buffer of length n (contents undefined).
func getBuf(n int) []byte {
	c := class(n)
	if c > maxClass {
		return make([]byte, n)
	}
	if p, ok := pools[c].Get().(*[]byte); ok {
		return (*p)[:n]
	}
	return make([]byte, n, 1<<c)
}

// putBuf gives a buffer from getBuf back.
func putBuf(b []byte) {
	c := cap(b)
	if c == 0 || c&(c-1) != 0 || bits.Len(uint(c))-1 > maxClass || c < 1<<minClass {
		return
	}
	b = b[:c]
	pools[bits.Len(uint(c))-1].Put(&b)
}
