package blockdev

import (
	"errors"
	"fmt"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/berth-io/berth/internal/blockdev/backing"
)

// backingOpen is FUSE_DEV_IOC_BACKING_OPEN: _IOW(229, 1, struct
// fuse_backing_map), the map being {int32 fd; uint32 flags; uint64 padding}.
const backingOpen = 1<<30 | 16<<16 | 229<<8 | 1

type backingMap struct {
	fd      int32
	flags   uint32
	padding uint64
}

// registerBacking hands the image to the kernel for passthrough and returns
// its id on this connection.
func registerBacking(dev int, img backing.Descriptor) (int32, error) {
	m := backingMap{fd: int32(img.Fd())}
	id, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(dev), backingOpen, uintptr(unsafe.Pointer(&m)))
	if errno != 0 {
		return 0, fmt.Errorf("register image for passthrough: %w", errno)
	}
	return int32(id), nil
}

// ensureBacking registers the image once per connection and saves the id
// with the settings, so later servers reuse it instead of adding another.
func (s *Server) ensureBacking() error {
	cur := s.settings.Load()
	if cur == nil || !cur.Passthrough() || cur.BackingID > 0 {
		return nil
	}
	img, ok := s.cfg.Image.(backing.Descriptor)
	if !ok {
		return errors.New("passthrough negotiated for an image without a file descriptor")
	}
	id, err := registerBacking(s.cfg.Dev, img)
	if err != nil {
		return err
	}
	next := *cur
	next.BackingID = id
	if err := s.cfg.OnInit(next); err != nil {
		return err
	}
	s.settings.Store(&next)
	s.cfg.Log.Info("image registered for passthrough", "backingID", id)
	return nil
}
