package capacity

import (
	"testing"
	"time"
)

// TestRetryWait: a failing round is retried after 1s, then twice as long
// each time, never longer than 10s or the interval.
func TestRetryWait(t *testing.T) {
	for _, c := range []struct {
		failures int
		interval time.Duration
		want     time.Duration
	}{
		{1, time.Minute, time.Second},
		{2, time.Minute, 2 * time.Second},
		{4, time.Minute, 8 * time.Second},
		{5, time.Minute, 10 * time.Second},
		{1000, time.Minute, 10 * time.Second},
		{3, 3 * time.Second, 3 * time.Second},
		{1, 500 * time.Millisecond, 500 * time.Millisecond},
	} {
		if got := retryWait(c.failures, c.interval); got != c.want {
			t.Errorf("retryWait(%d, %s) = %s, want %s", c.failures, c.interval, got, c.want)
		}
	}
}
