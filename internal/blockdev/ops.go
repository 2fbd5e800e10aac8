package blockdev

import (
	"bytes"

	"golang.org/x/sys/unix"
)

// attrValid is how long (seconds) the kernel caches names and attributes;
// short, so that a resize is seen soon.
const attrValid = 1

// handle answers the request of n bytes in b.in.
func (s *Server) handle(b *buffers, n int) error {
	if n < inHeaderSize {
		return nil
	}
	h := parseInHeader(b.in)
	body := b.in[inHeaderSize:n]
	switch h.opcode {
	case opForget, opBatchForget, opInterrupt:
		return nil // no reply: nodes are constant, interrupts are rare and safe to ignore
	case opInit:
		return s.doInit(b, h, body)
	case opLookup:
		return s.doLookup(b, h, body)
	case opGetattr:
		return s.doGetattr(b, h)
	case opSetattr:
		return s.doSetattr(b, h, body)
	case opOpen:
		return s.doOpen(b, h)
	case opRead:
		return s.doRead(b, h, body)
	case opWrite:
		return s.doWrite(b, h, body)
	case opFsync, opFsyncdir:
		if err := s.cfg.Image.Sync(); err != nil {
			s.cfg.Log.Error(err, "fsync failed")
			return s.reply(b, h.unique, s.ioFailed(err), 0)
		}
		return s.reply(b, h.unique, 0, 0)
	case opFlush, opRelease, opReleasedir, opDestroy:
		return s.reply(b, h.unique, 0, 0)
	case opStatfs:
		return s.doStatfs(b, h)
	case opFallocate:
		return s.doFallocate(b, h, body)
	case opOpendir:
		if h.nodeID != rootID {
			return s.reply(b, h.unique, unix.ENOTDIR, 0)
		}
		le.PutUint64(b.data(16), dirFH)
		le.PutUint64(b.data(16)[8:], 0)
		return s.reply(b, h.unique, 0, 16)
	case opReaddir:
		return s.doReaddir(b, h, body)
	default:
		return s.reply(b, h.unique, unix.ENOSYS, 0)
	}
}

func (s *Server) doInit(b *buffers, h inHeader, body []byte) error {
	if len(body) < 16 {
		return s.reply(b, h.unique, unix.EINVAL, 0)
	}
	in := parseInitIn(body)
	if in.Major != protoMajor {
		s.cfg.Log.Info("kernel speaks another FUSE major version", "major", in.Major)
		return s.reply(b, h.unique, unix.EPROTO, 0)
	}
	set := negotiate(in, s.cfg.Passthrough)
	if err := s.cfg.OnInit(set); err != nil {
		// Without saved settings no later server could take over: refuse
		// to serve rather than run a connection that cannot be handed on.
		return err
	}
	s.settings.Store(&set)
	n := initOutSize(in.Minor)
	putInitOut(b.data(64), set.Out)
	if err := s.reply(b, h.unique, 0, n); err != nil {
		return err
	}
	s.cfg.Log.Info("answered INIT", "minor", set.Out.Minor, "maxWrite", set.Out.MaxWrite,
		"kernelResends", set.KernelResends(), "passthrough", set.Passthrough())
	if err := s.ensureBacking(); err != nil {
		return err
	}
	s.markReady()
	return nil
}

func (s *Server) nodeAttr(id uint64) (attr, bool) {
	switch id {
	case rootID:
		return attr{ino: rootID, mode: unix.S_IFDIR | 0o755, nlink: 2, mtime: s.start}, true
	case fileID:
		size, err := s.cfg.Image.Restat()
		if err != nil {
			s.cfg.Log.Error(err, "image size unknown, serving the last one", "size", size)
		}
		return attr{ino: fileID, size: uint64(size), mode: unix.S_IFREG | 0o600, nlink: 1, mtime: s.start}, true
	}
	return attr{}, false
}

func (s *Server) doLookup(b *buffers, h inHeader, body []byte) error {
	name := body
	if i := bytes.IndexByte(name, 0); i >= 0 {
		name = name[:i]
	}
	if h.nodeID != rootID || string(name) != FileName {
		return s.reply(b, h.unique, unix.ENOENT, 0)
	}
	a, _ := s.nodeAttr(fileID)
	out := b.data(40 + attrSize)
	le.PutUint64(out[0:], fileID)
	le.PutUint64(out[8:], 1) // generation
	le.PutUint64(out[16:], attrValid)
	le.PutUint64(out[24:], attrValid)
	le.PutUint64(out[32:], 0) // both nsec fields
	putAttr(out[40:], a)
	return s.reply(b, h.unique, 0, len(out))
}

func (s *Server) replyAttr(b *buffers, h inHeader, id uint64) error {
	a, ok := s.nodeAttr(id)
	if !ok {
		return s.reply(b, h.unique, unix.ENOENT, 0)
	}
	out := b.data(16 + attrSize)
	le.PutUint64(out[0:], attrValid)
	le.PutUint64(out[8:], 0)
	putAttr(out[16:], a)
	return s.reply(b, h.unique, 0, len(out))
}

func (s *Server) doGetattr(b *buffers, h inHeader) error { return s.replyAttr(b, h, h.nodeID) }

// doSetattr honours size changes of the file (expansion); other attributes
// are fixed and silently kept.
func (s *Server) doSetattr(b *buffers, h inHeader, body []byte) error {
	if len(body) < 24 {
		return s.reply(b, h.unique, unix.EINVAL, 0)
	}
	if valid := le.Uint32(body[0:]); valid&fattrSize != 0 {
		if h.nodeID != fileID {
			return s.reply(b, h.unique, unix.EISDIR, 0)
		}
		if err := s.cfg.Image.Truncate(int64(le.Uint64(body[16:]))); err != nil {
			s.cfg.Log.Error(err, "truncate failed", "size", le.Uint64(body[16:]))
			return s.reply(b, h.unique, s.ioFailed(err), 0)
		}
	}
	return s.replyAttr(b, h, h.nodeID)
}

func (s *Server) doOpen(b *buffers, h inHeader) error {
	if h.nodeID != fileID {
		return s.reply(b, h.unique, unix.EISDIR, 0)
	}
	out := b.data(16)
	le.PutUint64(out[0:], fileFH)
	// Direct I/O: the loop device above has its own cache; parallel writes:
	// without it the kernel serializes writes to the file.
	flags, backing := uint32(fopenDirectIO|fopenParallelW), int32(0)
	if set := s.settings.Load(); set != nil && set.BackingID > 0 {
		flags, backing = fopenPassthru, set.BackingID
	}
	le.PutUint32(out[8:], flags)
	le.PutUint32(out[12:], uint32(backing))
	return s.reply(b, h.unique, 0, 16)
}

func (s *Server) doRead(b *buffers, h inHeader, body []byte) error {
	if len(body) < 24 || h.nodeID != fileID {
		return s.reply(b, h.unique, unix.EINVAL, 0)
	}
	off := int64(le.Uint64(body[8:]))
	size := min(int(le.Uint32(body[16:])), maxWrite)
	if s.async != nil {
		return s.startAsync(b, h, "read", off, size, func(done func(int, error)) error {
			return s.async.StartRead(b.data(size), off, done)
		}, func(n int) int { return n })
	}
	n, err := s.cfg.Image.ReadAt(b.data(size), off)
	if err != nil {
		s.cfg.Log.Error(err, "read failed", "offset", off, "size", size)
		return s.reply(b, h.unique, s.ioFailed(err), 0)
	}
	return s.reply(b, h.unique, 0, n)
}

func (s *Server) doWrite(b *buffers, h inHeader, body []byte) error {
	if len(body) < writeInSize || h.nodeID != fileID {
		return s.reply(b, h.unique, unix.EINVAL, 0)
	}
	off := int64(le.Uint64(body[8:]))
	size := int(le.Uint32(body[16:]))
	data := body[writeInSize:]
	if size > len(data) {
		return s.reply(b, h.unique, unix.EINVAL, 0)
	}
	if s.async != nil {
		return s.startAsync(b, h, "write", off, size, func(done func(int, error)) error {
			return s.async.StartWrite(data[:size], off, done)
		}, func(n int) int {
			out := b.data(8)
			le.PutUint32(out[0:], uint32(n))
			le.PutUint32(out[4:], 0)
			return 8
		})
	}
	n, err := s.cfg.Image.WriteAt(data[:size], off)
	if err != nil {
		s.cfg.Log.Error(err, "write failed", "offset", off, "size", size)
		return s.reply(b, h.unique, s.ioFailed(err), 0)
	}
	out := b.data(8)
	le.PutUint32(out[0:], uint32(n))
	le.PutUint32(out[4:], 0)
	return s.reply(b, h.unique, 0, 8)
}

func (s *Server) doStatfs(b *buffers, h inHeader) error {
	out := b.data(80)
	clear(out)
	blocks := uint64(s.cfg.Image.Size()) / pageSize
	le.PutUint64(out[0:], blocks)
	le.PutUint64(out[24:], 2) // files
	le.PutUint32(out[40:], pageSize)
	le.PutUint32(out[44:], 255) // namelen
	le.PutUint32(out[48:], pageSize)
	return s.reply(b, h.unique, 0, 80)
}

// dirEntries is the whole root directory, in offset order.
var dirEntries = [...]struct {
	ino  uint64
	name string
	typ  uint32
}{
	{rootID, ".", unix.DT_DIR},
	{rootID, "..", unix.DT_DIR},
	{fileID, FileName, unix.DT_REG},
}

func (s *Server) doReaddir(b *buffers, h inHeader, body []byte) error {
	if len(body) < 24 || h.nodeID != rootID {
		return s.reply(b, h.unique, unix.ENOTDIR, 0)
	}
	off := le.Uint64(body[8:])
	limit := min(int(le.Uint32(body[16:])), maxWrite)
	out := b.data(limit)
	n := 0
	for i := off; i < uint64(len(dirEntries)); i++ {
		e := dirEntries[i]
		size := (24 + len(e.name) + 7) &^ 7
		if n+size > limit {
			break
		}
		d := out[n : n+size]
		clear(d)
		le.PutUint64(d[0:], e.ino)
		le.PutUint64(d[8:], i+1) // offset of the next entry
		le.PutUint32(d[16:], uint32(len(e.name)))
		le.PutUint32(d[20:], e.typ)
		copy(d[24:], e.name)
		n += size
	}
	return s.reply(b, h.unique, 0, n)
}

// doFallocate serves the loop device's discard and write-zeroes (punch hole,
// zero range) on the image.
func (s *Server) doFallocate(b *buffers, h inHeader, body []byte) error {
	if len(body) < 28 || h.nodeID != fileID {
		return s.reply(b, h.unique, unix.EINVAL, 0)
	}
	off := int64(le.Uint64(body[8:]))
	length := int64(le.Uint64(body[16:]))
	mode := le.Uint32(body[24:])
	if err := s.cfg.Image.Fallocate(mode, off, length); err != nil {
		s.cfg.Log.Error(err, "fallocate failed", "offset", off, "length", length, "mode", mode)
		return s.reply(b, h.unique, s.ioFailed(err), 0)
	}
	return s.reply(b, h.unique, 0, 0)
}
