package backing

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/berth-io/berth/internal/blockdev/rbdimage"
)

// Open tells an RBD image from an image file by its spec.
func TestOpenDispatches(t *testing.T) {
	path := filepath.Join(t.TempDir(), "disk.img")
	if err := os.WriteFile(path, make([]byte, 4096), 0o600); err != nil {
		t.Fatal(err)
	}
	img, err := Open(path, false)
	if err != nil || img.Size() != 4096 {
		t.Fatalf("Open(file) = %v, %v", img, err)
	}
	_ = img.Close()
	// No access file there: refused by the RBD side, never opened as a file.
	img, err = Open(rbdimage.Spec(path+".json"), false)
	if err == nil || img != nil || (!errors.Is(err, os.ErrNotExist) && !errors.Is(err, rbdimage.ErrNotBuilt)) {
		t.Fatalf("Open(rbd spec) = %v, %v", img, err)
	}
}
