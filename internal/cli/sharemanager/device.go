package sharemanager

import (
	"context"
	"errors"
	"fmt"
	"time"

	"golang.org/x/sys/unix"
)

// waitDevice waits until Device is a block device (the volume attachment
// may still be under way when the pod starts).
func (c Config) waitDevice(ctx context.Context) error {
	start := c.Clock.Now()
	tick := c.Clock.NewTicker(devicePoll)
	defer tick.Stop()
	for {
		var st unix.Stat_t
		err := unix.Stat(c.Device, &st)
		if err == nil && st.Mode&unix.S_IFMT == unix.S_IFBLK {
			return nil
		}
		if err == nil {
			err = errors.New("not a block device")
		}
		if c.Clock.Since(start) >= c.DeviceTimeout {
			return fmt.Errorf("device %s not there after %s: %w", c.Device, c.DeviceTimeout, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C():
		}
	}
}

const devicePoll = 200 * time.Millisecond
