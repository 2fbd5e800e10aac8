//go:build capture

package blockdev

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"golang.org/x/sys/unix"

	"github.com/berth-io/berth/internal/keeper"
)

func TestCaptureFUSE(t *testing.T) {
	k := keeper.HostKernel{}
	fd, err := k.OpenFUSE()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	mp := filepath.Join(dir, "m")
	if err := k.MountFUSE(fd, "berth:cap", mp); err != nil {
		t.Fatal(err)
	}
	imgPath := filepath.Join(dir, "img")
	_ = os.WriteFile(imgPath, nil, 0o600)
	_ = os.Truncate(imgPath, 16<<20)
	img, err := OpenImage(imgPath, true)
	if err != nil {
		t.Fatal(err)
	}
	s, _ := NewServer(Config{Dev: fd, Image: img, Log: logr.Discard()})
	b, _ := newBuffers()
	var mu sync.Mutex
	var reqs [][]byte
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			n, err := unix.Read(fd, b.in)
			if err == unix.EINTR || err == unix.ENOENT {
				continue
			}
			if err != nil {
				return
			}
			mu.Lock()
			reqs = append(reqs, append([]byte(nil), b.in[:n]...))
			mu.Unlock()
			if err := s.handle(b, n); err != nil {
				return
			}
		}
	}()
	sh := func(c string) {
		out, err := exec.Command("sh", "-c", c).CombinedOutput()
		t.Logf("%s: %v %s", c, err, out)
	}
	f := filepath.Join(mp, FileName)
	sh("ls -la " + mp + "; stat " + f + "; stat -f " + mp)
	dev, _ := exec.Command("losetup", "--find", "--show", "--direct-io=on", f).Output()
	d := strings.TrimSpace(string(dev))
	sh("dd if=/dev/urandom of=" + d + " bs=4k count=2 oflag=direct; dd if=" + d + " of=/dev/null bs=4k count=2 iflag=direct; dd if=/dev/urandom of=" + d + " bs=512 count=1 seek=3 oflag=direct,sync")
	sh("blkdiscard -o 1048576 -l 1048576 " + d + "; blkdiscard -z -o 2097152 -l 65536 " + d + "; sync")
	sh("losetup -d " + d)
	sh("truncate -s 32M " + f + "; dd if=" + f + " of=/dev/null bs=1000 count=1 skip=3; ls " + mp + "/nothere; fallocate -p -o 0 -l 4096 " + f + "; sync " + f)
	time.Sleep(200 * time.Millisecond)
	_ = k.Unmount(mp)
	_ = unix.Close(fd)
	<-done
	mu.Lock()
	defer mu.Unlock()
	out := "/tmp/fuzzcap/fuse"
	_ = os.MkdirAll(out, 0o755)
	count := map[uint32]int{}
	var stream []byte
	for i, r := range reqs {
		h := parseInHeader(r)
		t.Logf("req %d op %d len %d n %d", i, h.opcode, h.length, len(r))
		if len(r) > 16<<10 {
			continue
		}
		if count[h.opcode] < 2 {
			_ = os.WriteFile(fmt.Sprintf("%s/op%02d-%d", out, h.opcode, count[h.opcode]), r, 0o644)
		}
		count[h.opcode]++
		if len(stream) < 64<<10 {
			stream = append(stream, r...)
		}
		if h.opcode == opInit {
			set := negotiate(parseInitIn(r[inHeaderSize:]), false)
			j, _ := set.Marshal()
			_ = os.WriteFile(out+"/settings.json", j, 0o644)
			set = negotiate(parseInitIn(r[inHeaderSize:]), true)
			j, _ = set.Marshal()
			_ = os.WriteFile(out+"/settings-passthrough.json", j, 0o644)
		}
	}
	_ = os.WriteFile(out+"/stream", stream, 0o644)
}
