package share

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"

	"github.com/berth-io/berth/internal/share/sharetest"
)

// TestProbeAgainstRealGanesha probes a real ganesha export in each minor
// version: 4.1 and 4.2 with COMMIT over a session, 4.0 through the
// library client.
func TestProbeAgainstRealGanesha(t *testing.T) {
	g := sharetest.Start(t, 0, 1, 2)
	for _, minor := range []int{2, 1, 0} {
		res, err := ProbeConfig{Endpoint: g.Endpoint, Size: 600<<10 + 1, Timeout: 30 * time.Second, MinorVersion: minor, Log: testr.New(t)}.Run(context.Background())
		if err != nil {
			t.Fatalf("probe in NFSv4.%d: %v", minor, err)
		}
		if _, err := os.Stat(filepath.Join(g.Dir, res.File)); !os.IsNotExist(err) {
			t.Errorf("NFSv4.%d probe left %s behind: %v", minor, res.File, err)
		}
		t.Logf("NFSv4.%d: %d bytes in %s", minor, res.Bytes, res.Took)
	}
}

// TestProbeKeepsAndVerifies: --keep leaves the file in the export, a later
// probe's --verify reads it back by checksum (in each minor version), and
// a wrong checksum or a missing file fails.
func TestProbeKeepsAndVerifies(t *testing.T) {
	g := sharetest.Start(t, 0, 1, 2)
	kept, err := ProbeConfig{Endpoint: g.Endpoint, Size: 300<<10 + 3, Timeout: 30 * time.Second, MinorVersion: 1,
		Keep: "before", Log: testr.New(t)}.Run(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(filepath.Join(g.Dir, "before"))
	if err != nil {
		t.Fatalf("kept file: %v", err)
	}
	if sum := sha256.Sum256(data); hex.EncodeToString(sum[:]) != kept.SHA256 || kept.File != "before" {
		t.Fatalf("kept %s with sha256 %s, the export has %x", kept.File, kept.SHA256, sum)
	}
	for _, minor := range []int{2, 1, 0} {
		_, err := ProbeConfig{Endpoint: g.Endpoint, Size: 1000, Timeout: 30 * time.Second, MinorVersion: minor,
			Verify: map[string]string{"before": kept.SHA256}, Log: testr.New(t)}.Run(context.Background())
		if err != nil {
			t.Errorf("NFSv4.%d verify: %v", minor, err)
		}
	}
	wrong := strings.Repeat("0", 64)
	for name, sum := range map[string]string{"before": wrong, "absent": kept.SHA256} {
		_, err := ProbeConfig{Endpoint: g.Endpoint, Size: 1000, Timeout: 5 * time.Second, MinorVersion: 1,
			Verify: map[string]string{name: sum}, Log: testr.New(t)}.Run(context.Background())
		if err == nil {
			t.Errorf("verify of %s with sha256 %s passed", name, sum)
		}
		t.Logf("verify %s: %v", name, err)
	}
}

// TestProbeOnAFullShareSaysNoSpace probes a share on a 1 MiB tmpfs with
// 2 MiB, in NFSv4.1 and in 4.0, whose library loses the WRITE's error:
// the probe fails at once with ENOSPC instead of retrying until its
// timeout, and removes what it wrote.
func TestProbeOnAFullShareSaysNoSpace(t *testing.T) {
	g := sharetest.StartOnTmpfs(t, 1<<20, 0, 1)
	for _, minor := range []int{1, 0} {
		start := time.Now()
		_, err := ProbeConfig{Endpoint: g.Endpoint, Size: 2 << 20, Timeout: 30 * time.Second, MinorVersion: minor,
			Log: testr.New(t)}.Run(context.Background())
		took := time.Since(start)
		if !errors.Is(err, syscall.ENOSPC) {
			t.Errorf("NFSv4.%d probe of a full share: %v, want ENOSPC", minor, err)
		}
		if took > 10*time.Second {
			t.Errorf("NFSv4.%d probe of a full share took %s: it retried", minor, took)
		}
		t.Logf("NFSv4.%d: %v after %s", minor, err, took)
		if left, _ := filepath.Glob(filepath.Join(g.Dir, ".berth-probe-*")); len(left) != 0 {
			t.Errorf("NFSv4.%d probe left %q on the full share", minor, left)
		}
	}
}
