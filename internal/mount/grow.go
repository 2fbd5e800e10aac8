package mount

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"

	"k8s.io/utils/exec"
)

// ErrGrowsAtStage means a mounted filesystem cannot grow on this node (ext4
// online resize needs CAP_SYS_RESOURCE); it grows when the volume is staged
// again, before it is mounted.
var ErrGrowsAtStage = errors.New("the mounted filesystem cannot grow here; it grows the next time the volume is staged (restart the pod)")

// growUnmounted grows an ext filesystem on the unmounted dev to the device's
// size. Unmounted, resize2fs writes the device itself and needs no
// capability beyond opening it. Other types grow once mounted (growMounted).
func (m *Manager) growUnmounted(ctx context.Context, dev, fsType string) error {
	if fsType != "ext4" && fsType != "ext3" {
		return nil
	}
	fsSize, block, err := m.extSize(ctx, dev)
	if err != nil {
		return err
	}
	// blockdev, not a read here: a device whose server died hangs a read,
	// and the tool is bounded.
	out, err := m.exec.Bind(ctx).Command("blockdev", "--getsize64", dev).CombinedOutput()
	if err != nil {
		return fmt.Errorf("size of %s: %w: %s", dev, err, strings.TrimSpace(string(out)))
	}
	devSize, err := parseSize64(string(out))
	if err != nil {
		return fmt.Errorf("size of %s: %w", dev, err)
	}
	if devSize-fsSize < block {
		return nil // full size already: no check, no write
	}
	tools := m.exec.Bind(ctx)
	// resize2fs refuses a filesystem not checked since it was last mounted.
	// -p repairs only what is safe; exit 1 means it did.
	if out, err := tools.Command("e2fsck", "-f", "-p", dev).CombinedOutput(); err != nil {
		var ee exec.ExitError
		if !errors.As(err, &ee) || ee.ExitStatus() != 1 {
			return fmt.Errorf("e2fsck %s before growing it: %w: %s", dev, err, strings.TrimSpace(string(out)))
		}
	}
	if out, err := tools.Command("resize2fs", dev).CombinedOutput(); err != nil {
		return fmt.Errorf("resize2fs %s: %w: %s", dev, err, strings.TrimSpace(string(out)))
	}
	m.log.Info("grew filesystem before mount", "device", dev, "fsType", fsType, "from", fsSize, "to", devSize)
	return nil
}

// growMounted grows an xfs filesystem just mounted at staging: xfs grows
// only mounted, and xfs_growfs needs no capability for it. A failure leaves
// the volume staged at its old size (NodeExpandVolume tries again), so it is
// logged, not returned.
func (m *Manager) growMounted(ctx context.Context, dev, staging, fsType string) {
	if fsType != "xfs" {
		return
	}
	if out, err := m.exec.Bind(ctx).Command("xfs_growfs", "-d", staging).CombinedOutput(); err != nil {
		m.log.Error(err, "grow xfs after mount", "device", dev, "path", staging, "output", strings.TrimSpace(string(out)))
	}
}

// extSize reads the size and block size of the ext filesystem on dev from
// its superblock.
func (m *Manager) extSize(ctx context.Context, dev string) (size, block int64, err error) {
	out, err := m.exec.Bind(ctx).Command("dumpe2fs", "-h", dev).CombinedOutput()
	if err != nil {
		return 0, 0, fmt.Errorf("dumpe2fs %s: %w: %s", dev, err, strings.TrimSpace(string(out)))
	}
	size, block, err = parseExtSize(string(out))
	if err != nil {
		return 0, 0, fmt.Errorf("dumpe2fs %s: %w", dev, err)
	}
	return size, block, nil
}

// parseSize64 reads `blockdev --getsize64`: one byte count.
func parseSize64(out string) (int64, error) {
	n, err := strconv.ParseInt(strings.TrimSpace(out), 10, 64)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("%q is not a size: %w", out, errors.Join(err, errBadToolOutput))
	}
	return n, nil
}

// errBadToolOutput: a tool's output does not say what it should.
var errBadToolOutput = errors.New("unexpected tool output")

// parseExtSize reads the size and block size of an ext filesystem from
// `dumpe2fs -h` output. ext block sizes are powers of two from 1 KiB to
// 64 KiB; a block count whose bytes overflow is no filesystem's either.
func parseExtSize(out string) (size, block int64, err error) {
	var count int64
	for _, line := range strings.Split(out, "\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		n, perr := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
		switch strings.TrimSpace(k) {
		case "Block count":
			count, err = n, perr
		case "Block size":
			block, err = n, perr
		default:
			continue
		}
		if err != nil {
			return 0, 0, fmt.Errorf("%q: %w", line, err)
		}
	}
	if count <= 0 || block <= 0 {
		return 0, 0, fmt.Errorf("no block count or size in its output: %w", errBadToolOutput)
	}
	if block < 1024 || block > 65536 || block&(block-1) != 0 || count > math.MaxInt64/block {
		return 0, 0, fmt.Errorf("block count %d of %d bytes is no ext filesystem's: %w", count, block, errBadToolOutput)
	}
	return count * block, block, nil
}
