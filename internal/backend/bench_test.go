package backend

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"testing"

	"github.com/go-logr/logr"
)

// BenchmarkSnapshotSparse snapshots a 1 GiB image holding 64 MiB of data on
// the test dir's filesystem (a sparse copy where it has no reflink).
func BenchmarkSnapshotSparse(b *testing.B) {
	ctx := context.Background()
	l, err := NewLocal(b.TempDir(), logr.Discard())
	if err != nil {
		b.Fatal(err)
	}
	src, err := l.Create(ctx, "src", 1<<30)
	if err != nil {
		b.Fatal(err)
	}
	f, err := os.OpenFile(src.Path, os.O_WRONLY, 0)
	if err != nil {
		b.Fatal(err)
	}
	chunk := bytes.Repeat([]byte{0xab}, 4*mib)
	for i := range 16 { // 16 x 4 MiB spread over the image
		if _, err := f.WriteAt(chunk, int64(i)*64*mib); err != nil {
			b.Fatal(err)
		}
	}
	_ = f.Close()
	b.SetBytes(64 * mib)
	i := 0
	for b.Loop() {
		id := fmt.Sprintf("s%d", i)
		i++
		if _, err := l.CreateSnapshot(ctx, id, "src"); err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		_ = l.DeleteSnapshot(ctx, id)
		b.StartTimer()
	}
}
