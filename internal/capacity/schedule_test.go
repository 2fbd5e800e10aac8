package capacity

import (
	"testing"
	"time"
)

// TestNextWait: a round that asks to run soon runs within a second, or,
// after failures in a row, after 1s, then twice as long each time, never
// longer than 10s or the interval; a round that does not ask to run soon
// waits the interval, failed or not.
func TestNextWait(t *testing.T) {
	for _, c := range []struct {
		soon     bool
		failures int
		interval time.Duration
		want     time.Duration
	}{
		{false, 0, time.Minute, time.Minute},
		{false, 3, time.Minute, time.Minute},
		{true, 0, time.Minute, time.Second},
		{true, 1, time.Minute, time.Second},
		{true, 2, time.Minute, 2 * time.Second},
		{true, 4, time.Minute, 8 * time.Second},
		{true, 5, time.Minute, 10 * time.Second},
		{true, 1000, time.Minute, 10 * time.Second},
		{true, 3, 3 * time.Second, 3 * time.Second},
		{true, 0, 500 * time.Millisecond, 500 * time.Millisecond},
	} {
		if got := nextWait(c.soon, c.failures, c.interval); got != c.want {
			t.Errorf("nextWait(%v, %d, %s) = %s, want %s", c.soon, c.failures, c.interval, got, c.want)
		}
	}
}
