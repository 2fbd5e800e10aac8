package sharemanager

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/berth-io/berth/internal/mount"
)

// errGrowAtStage ends a serve whose device grew while the mounted
// filesystem cannot grow in place (ext4 without CAP_SYS_RESOURCE): Run
// stages the volume again, which grows it unmounted, and serves again.
var errGrowAtStage = errors.New("the device grew and the mounted filesystem grows only when staged again")

// watchSize grows the served filesystem whenever the device grows (the
// agent of this node grows the device after a volume expansion), from the
// size the device had when the serve began. It returns nil when ctx ends
// and an error wrapping errGrowAtStage when only a new stage can grow it;
// other failures are logged and tried again at the next tick. report gets
// the size the filesystem fills, at the start and after each growth.
func (c Config) watchSize(ctx context.Context, report func(size int64)) error {
	grown, err := mount.DeviceSize(c.Device)
	if err != nil {
		c.Log.Info("cannot read the device's size; the device check reports it", "err", err.Error())
	} else {
		report(grown)
	}
	tick := c.Clock.NewTicker(c.sizeInterval())
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C():
		}
		size, err := mount.DeviceSize(c.Device)
		if err != nil || size <= grown {
			continue
		}
		err = c.Mounter.Expand(ctx, c.Device, c.MountPath)
		switch {
		case errors.Is(err, mount.ErrGrowsAtStage):
			return fmt.Errorf("%w: device %s is %d bytes now, was %d: %w", errGrowAtStage, c.Device, size, grown, err)
		case err != nil:
			c.Log.Info("could not grow the filesystem; trying again", "device", c.Device, "size", size, "err", err.Error())
			continue
		}
		c.Log.Info("grew the served filesystem online", "device", c.Device, "from", grown, "to", size)
		grown = size
		report(grown)
	}
}

func (c Config) sizeInterval() time.Duration {
	if c.CheckInterval > 0 {
		return c.CheckInterval
	}
	return 5 * time.Second
}
