package sanity

import (
	"io"
	"net"
	"testing"
	"time"
)

// slowAccept puts a Unix-socket proxy in front of target that waits a
// moment before it connects each client through. csi-test's Connect
// (utils.Connect) dials, then waits for a state change away from the state
// it reads next: when the connection is already Ready by then, it waits for
// a minute and fails ("Connection timed out"). The pause makes Ready come
// after that read. It changes nothing the driver sees.
func slowAccept(t *testing.T, listen, target string) {
	t.Helper()
	l, err := net.Listen("unix", listen)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer func() { _ = c.Close() }()
				time.Sleep(100 * time.Millisecond)
				up, err := net.Dial("unix", target)
				if err != nil {
					return
				}
				defer func() { _ = up.Close() }()
				go func() { _, _ = io.Copy(up, c) }()
				_, _ = io.Copy(c, up)
			}()
		}
	}()
}
