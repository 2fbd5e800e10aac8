package mount

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/berth-io/berth/internal/volerr"
)

func TestNFSClientCheck(t *testing.T) {
	const withNFS = "nodev\tsysfs\nnodev\tnfs\nnodev\tnfs4\n\text4\n"
	const without = "nodev\tsysfs\nnodev\tfuse\n\text4\n"
	for _, c := range []struct {
		name, filesystems string
		module, builtin   bool
		helper, ok        bool
	}{
		{name: "registered", filesystems: withNFS, helper: true, ok: true},
		{name: "module to load", filesystems: without, module: true, helper: true, ok: true},
		{name: "built in", filesystems: without, builtin: true, helper: true, ok: true},
		{name: "no kernel client", filesystems: without, helper: true},
		{name: "no mount.nfs", filesystems: withNFS},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			c0 := NFSClient{Filesystems: filepath.Join(dir, "filesystems"), Modules: filepath.Join(dir, "modules"),
				Helpers: []string{filepath.Join(dir, "mount.nfs4")}}
			write := func(p, s string) {
				if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			write(c0.Filesystems, c.filesystems)
			if c.module {
				write(filepath.Join(c0.Modules, "kernel/fs/nfs/nfsv4.ko.xz"), "")
			}
			if c.builtin {
				write(filepath.Join(c0.Modules, "modules.builtin"), "kernel/fs/nfs/nfs.ko\nkernel/fs/nfs/nfsv4.ko\n")
			}
			if c.helper {
				write(c0.Helpers[0], "")
			}
			err := c0.Check()
			if c.ok != (err == nil) || (err != nil && !(errors.Is(err, ErrNoNFSClient) && errors.Is(err, volerr.ErrPrecondition))) {
				t.Errorf("Check: %v, want ok=%t or ErrNoNFSClient", err, c.ok)
			}
		})
	}
}
