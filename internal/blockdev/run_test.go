package blockdev

import (
	"testing"

	"github.com/berth-io/berth/internal/blockdev/backing"
)

// parallelImage is an image that asks for its own worker count (as an RBD
// image does); only Workers is called.
type parallelImage struct{ backing.Image }

func (parallelImage) Workers() int { return 64 }

func TestWorkersFor(t *testing.T) {
	for _, c := range []struct {
		img      backing.Image
		n, want  int
		describe string
	}{
		{parallelImage{}, 0, 64, "an RBD-like image by default"},
		{parallelImage{}, 8, 8, "an RBD-like image with --workers"},
		{struct{ backing.Image }{}, 0, 0, "a file image by default (the server's own default)"},
		{struct{ backing.Image }{}, 8, 8, "a file image with --workers"},
	} {
		if got := workersFor(c.img, c.n); got != c.want {
			t.Errorf("%s: workersFor(%d) = %d, want %d", c.describe, c.n, got, c.want)
		}
	}
}
