// Package image writes container image tarballs (docker-save layout, which
// `ctr images import` reads) from files on this machine, without a registry
// or a container engine: the e2e cluster imports them and pods run them with
// imagePullPolicy: Never.
package image

import (
	"archive/tar"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// ErrInvalidSpec marks a Spec that cannot become an image; nothing is written.
var ErrInvalidSpec = errors.New("invalid image spec")

// File is one entry of the image's single layer.
type File struct {
	// Path is the absolute path inside the image.
	Path string
	// Source is the host file copied to Path (symlinks followed). Empty for a
	// symlink or a directory.
	Source string
	// Link, when set, makes Path a symlink to Link.
	Link string
	// Dir makes Path an empty directory.
	Dir bool
	// Mode is the unix permission bits (0o1777 for a sticky dir); 0 keeps
	// the source's (0755 for dirs).
	Mode os.FileMode
}

// Spec describes a one-layer linux/amd64 image.
type Spec struct {
	// Tag is the image reference, e.g. "registry.k8s.io/pause:3.10".
	Tag        string
	Files      []File
	Entrypoint []string
	Cmd        []string
	Env        []string
}

// epoch is the modification time of every entry, so that the same inputs
// give the same layer digest.
var epoch = time.Unix(0, 0).UTC()

// Write builds the image of spec and writes it to out (replaced atomically).
func Write(spec Spec, out string) error {
	tag, err := name.NewTag(spec.Tag)
	if err != nil {
		return fmt.Errorf("%w: tag %q: %w", ErrInvalidSpec, spec.Tag, err)
	}
	layerTar, err := layer(spec.Files)
	if err != nil {
		return err
	}
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(layerTar)), nil
	})
	if err != nil {
		return fmt.Errorf("layer of %s: %w", spec.Tag, err)
	}
	img, err := mutate.AppendLayers(empty.Image, l)
	if err != nil {
		return fmt.Errorf("append layer to %s: %w", spec.Tag, err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return fmt.Errorf("config of %s: %w", spec.Tag, err)
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture, cf.Created = "linux", "amd64", v1.Time{Time: epoch}
	cf.Config.Entrypoint, cf.Config.Cmd, cf.Config.Env = spec.Entrypoint, spec.Cmd, spec.Env
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		return fmt.Errorf("set config of %s: %w", spec.Tag, err)
	}
	if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
		return fmt.Errorf("image dir: %w", err)
	}
	tmp := out + ".tmp"
	if err := tarball.WriteToFile(tmp, tag, img); err != nil {
		_ = os.Remove(tmp)
		return fmt.Errorf("write %s: %w", out, err)
	}
	if err := os.Rename(tmp, out); err != nil {
		return fmt.Errorf("rename %s: %w", out, err)
	}
	return nil
}

// layer returns the tar of files plus every parent directory, in path order.
func layer(files []File) ([]byte, error) {
	byPath := map[string]File{}
	for _, f := range files {
		if !path.IsAbs(f.Path) || path.Clean(f.Path) != f.Path || f.Path == "/" {
			return nil, fmt.Errorf("%w: path %q must be absolute and clean", ErrInvalidSpec, f.Path)
		}
		if n := btoi(f.Source != "") + btoi(f.Link != "") + btoi(f.Dir); n != 1 {
			return nil, fmt.Errorf("%w: %s needs exactly one of Source, Link, Dir", ErrInvalidSpec, f.Path)
		}
		if prev, ok := byPath[f.Path]; ok && prev != f {
			return nil, fmt.Errorf("%w: %s given twice", ErrInvalidSpec, f.Path)
		}
		byPath[f.Path] = f
		for d := path.Dir(f.Path); d != "/"; d = path.Dir(d) {
			if _, ok := byPath[d]; !ok {
				byPath[d] = File{Path: d, Dir: true}
			}
		}
	}
	paths := make([]string, 0, len(byPath))
	for p := range byPath {
		paths = append(paths, p)
	}
	sort.Strings(paths)

	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, p := range paths {
		if err := writeEntry(tw, byPath[p]); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, fmt.Errorf("close layer: %w", err)
	}
	return buf.Bytes(), nil
}

func writeEntry(tw *tar.Writer, f File) error {
	hdr := &tar.Header{Name: strings.TrimPrefix(f.Path, "/"), ModTime: epoch, Format: tar.FormatPAX}
	switch {
	case f.Dir:
		hdr.Typeflag, hdr.Mode, hdr.Name = tar.TypeDir, int64(modeOr(f.Mode, 0o755)), hdr.Name+"/"
		return writeHeader(tw, hdr)
	case f.Link != "":
		hdr.Typeflag, hdr.Mode, hdr.Linkname = tar.TypeSymlink, 0o777, f.Link
		return writeHeader(tw, hdr)
	}
	data, err := os.ReadFile(f.Source)
	if err != nil {
		return fmt.Errorf("read %s for %s: %w", f.Source, f.Path, err)
	}
	st, err := os.Stat(f.Source)
	if err != nil {
		return fmt.Errorf("stat %s: %w", f.Source, err)
	}
	hdr.Typeflag, hdr.Size = tar.TypeReg, int64(len(data))
	hdr.Mode = int64(modeOr(f.Mode, st.Mode().Perm()))
	if err := writeHeader(tw, hdr); err != nil {
		return err
	}
	if _, err := tw.Write(data); err != nil {
		return fmt.Errorf("write %s: %w", f.Path, err)
	}
	return nil
}

func writeHeader(tw *tar.Writer, hdr *tar.Header) error {
	if err := tw.WriteHeader(hdr); err != nil {
		return fmt.Errorf("tar header %s: %w", hdr.Name, err)
	}
	return nil
}

func modeOr(m, def os.FileMode) os.FileMode {
	if m == 0 {
		return def
	}
	return m & 0o7777 // raw unix bits, so 0o1777 gives a sticky /tmp
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}
