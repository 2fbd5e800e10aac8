package mount

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"unicode"
)

// addToolSeeds adds testdata/tools/<glob>: output of the real tools on
// this project's test machine (ext4, xfs and GPT loop devices).
func addToolSeeds(f *testing.F, glob string) {
	files, err := filepath.Glob(filepath.Join("testdata", "tools", glob))
	if err != nil || len(files) == 0 {
		f.Fatalf("no seeds %s (%v)", glob, err)
	}
	for _, name := range files {
		b, err := os.ReadFile(name)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(string(b))
	}
}

// FuzzBlkidType: stage decides whether a device may be formatted by what
// blkid says is on it. Whatever the output, the parse names a type (never
// "", which would read as blank) without spaces or control characters.
func FuzzBlkidType(f *testing.F) {
	addToolSeeds(f, "blkid-*.txt")
	f.Fuzz(func(t *testing.T, out string) {
		typ := parseBlkidType(out)
		if typ == "" || strings.IndexFunc(typ, func(r rune) bool { return unicode.IsSpace(r) || unicode.IsControl(r) }) >= 0 {
			t.Fatalf("parseBlkidType(%q) = %q", out, typ)
		}
	})
}

// FuzzExtSize: growth before mount compares the ext filesystem's size from
// `dumpe2fs -h` with the device's from `blockdev --getsize64`. An
// accepted size is positive and exactly count × block size for a block
// size ext has (1-64 KiB, a power of two); an accepted device size is not
// negative.
func FuzzExtSize(f *testing.F) {
	addToolSeeds(f, "dumpe2fs-*.txt")
	addToolSeeds(f, "blockdev.txt")
	f.Fuzz(func(t *testing.T, out string) {
		if size, block, err := parseExtSize(out); err == nil {
			if block < 1024 || block > 65536 || block&(block-1) != 0 || size <= 0 || size%block != 0 {
				t.Fatalf("parseExtSize(%q) = %d, %d", out, size, block)
			}
		}
		if n, err := parseSize64(out); err == nil && n < 0 {
			t.Fatalf("parseSize64(%q) = %d", out, n)
		}
	})
}

// TestToolSizesRefused: outputs no ext filesystem or device gives, which
// the parsers took before: a block count whose bytes overflow (a negative
// size, read as "no growth needed"), a block size ext cannot have, a
// negative device size.
func TestToolSizesRefused(t *testing.T) {
	for _, out := range []string{
		"Block count:              9223372036854775807\nBlock size:               4096\n",
		"Block count:              1000\nBlock size:               4095\n",
		"Block count:              1000\nBlock size:               1\n",
	} {
		if size, block, err := parseExtSize(out); err == nil {
			t.Errorf("parseExtSize(%q) = %d, %d", out, size, block)
		}
	}
	if n, err := parseSize64("-4096\n"); err == nil {
		t.Errorf("parseSize64 of a negative size = %d", n)
	}
}
