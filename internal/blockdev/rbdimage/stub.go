//go:build !ceph

package rbdimage

import "fmt"

// Built tells whether this binary can serve RBD images.
const Built = false

// Image is an RBD image; this build opens none.
type Image struct{ unbuilt }

// unbuilt gives Image the methods of backing.Image, never called.
type unbuilt struct{}

func (unbuilt) ReadAt([]byte, int64) (int, error)  { return 0, ErrNotBuilt }
func (unbuilt) WriteAt([]byte, int64) (int, error) { return 0, ErrNotBuilt }
func (unbuilt) Sync() error                        { return ErrNotBuilt }
func (unbuilt) Fallocate(uint32, int64, int64) error {
	return ErrNotBuilt
}
func (unbuilt) Size() int64            { return 0 }
func (unbuilt) Restat() (int64, error) { return 0, ErrNotBuilt }
func (unbuilt) Truncate(int64) error   { return ErrNotBuilt }
func (unbuilt) Direct() bool           { return false }
func (unbuilt) Close() error           { return nil }

// Open refuses: this binary has no librbd.
func Open(path string) (*Image, error) {
	return nil, fmt.Errorf("RBD image of %s: %w", path, ErrNotBuilt)
}
