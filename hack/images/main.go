// Command images writes the e2e cluster's image tarballs:
//
//	go run ./hack/images -out DIR -pause BIN [-busybox /bin/busybox] [-berth BIN] [-agnhost BIN] [-binary NAME=TAG=BIN ...]
//
// It writes DIR/pause.tar, DIR/busybox.tar, with -berth DIR/berth.tar, with
// -agnhost DIR/agnhost.tar (the e2e suite's agnhost on busybox) and,
// for each -binary, DIR/NAME.tar (one static binary at /NAME, its entrypoint);
// import each with `ctr -a SOCK -n k8s.io images import --platform linux/amd64 X.tar`.
package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/go-logr/logr/funcr"

	"github.com/berth-io/berth/internal/image"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "images:", err)
		os.Exit(1)
	}
}

func run() error {
	out := flag.String("out", "", "folder for the tarballs (required)")
	pause := flag.String("pause", "", "static pause binary (built from hack/images/pause); empty skips pause.tar")
	busybox := flag.String("busybox", "/bin/busybox", "static busybox (Debian busybox-static); empty skips busybox.tar")
	busyboxTag := flag.String("busybox-tag", image.BusyboxTag, "tag of the busybox image")
	berth := flag.String("berth", "", "berth binary (its shared libraries go along); empty skips berth.tar")
	berthTag := flag.String("berth-tag", image.BerthTag, "tag of the berth image")
	berthExtra := flag.String("berth-extra-tools", "", "comma-separated extra programs for the berth image, e.g. fio")
	agnhost := flag.String("agnhost", "", "static agnhost (hack/kube-binaries.sh agnhost), put on the -busybox-src busybox; empty skips agnhost.tar")
	agnhostTag := flag.String("agnhost-tag", "", "tag of the agnhost image (required with -agnhost)")
	busyboxSrc := flag.String("busybox-src", "/bin/busybox", "static busybox under agnhost")
	var binaries binaryFlags
	flag.Var(&binaries, "binary", "NAME=TAG=BIN: an image of one static binary at /NAME (e.g. a CSI sidecar); repeatable")
	flag.Parse()
	if *out == "" {
		return fmt.Errorf("-out is required")
	}
	log := funcr.New(func(prefix, args string) { fmt.Fprintln(os.Stderr, "images:", prefix, args) }, funcr.Options{})
	b := image.NewBuilder(log)

	if *pause != "" {
		if err := image.Write(image.PauseSpec(*pause), filepath.Join(*out, "pause.tar")); err != nil {
			return err
		}
	}
	if *busybox != "" {
		spec, err := b.BusyboxSpec(*busybox, *busyboxTag)
		if err != nil {
			return err
		}
		if err := image.Write(spec, filepath.Join(*out, "busybox.tar")); err != nil {
			return err
		}
	}
	if *berth != "" {
		var extra []string
		if *berthExtra != "" {
			extra = strings.Split(*berthExtra, ",")
		}
		spec, err := b.BerthSpec(*berth, *berthTag, extra...)
		if err != nil {
			return err
		}
		if err := image.Write(spec, filepath.Join(*out, "berth.tar")); err != nil {
			return err
		}
	}
	if *agnhost != "" {
		if *agnhostTag == "" {
			return fmt.Errorf("-agnhost needs -agnhost-tag")
		}
		spec, err := b.AgnhostSpec(*busyboxSrc, *agnhost, *agnhostTag)
		if err != nil {
			return err
		}
		if err := image.Write(spec, filepath.Join(*out, "agnhost.tar")); err != nil {
			return err
		}
	}
	for _, b := range binaries {
		spec := image.Spec{
			Tag:        b.tag,
			Files:      []image.File{{Path: "/" + b.name, Source: b.bin, Mode: 0o755}},
			Entrypoint: []string{"/" + b.name},
		}
		if err := image.Write(spec, filepath.Join(*out, b.name+".tar")); err != nil {
			return err
		}
	}
	return nil
}

type binaryImage struct{ name, tag, bin string }

// binaryFlags collects -binary NAME=TAG=BIN values.
type binaryFlags []binaryImage

func (f *binaryFlags) String() string { return fmt.Sprint(*f) }

func (f *binaryFlags) Set(v string) error {
	parts := strings.SplitN(v, "=", 3)
	if len(parts) != 3 || parts[0] == "" || parts[1] == "" || parts[2] == "" || strings.Contains(parts[0], "/") {
		return fmt.Errorf("want NAME=TAG=BIN, got %q", v)
	}
	*f = append(*f, binaryImage{name: parts[0], tag: parts[1], bin: parts[2]})
	return nil
}
