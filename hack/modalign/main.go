// Command modalign raises, in the Go module of the current folder, every
// requirement that berth's build list also has to berth's version, where
// berth's is the higher one.
//
// Why: Go's build cache keys a compiled package by the versions of its
// module and of everything below it. The test clusters' programs (the
// Kubernetes components, the CSI sidecars, CoreDNS, the CNI plugins) are
// built from source on a cold machine, each at its own versions of
// client-go, grpc and golang.org/x, so each compiled those again: about
// 170 s of both cores per client-go. At one version set they compile once.
// The programs stay the pinned releases; only shared libraries move up
// (patch or minor), as MVS would for any module that imports both.
//
//	go run ./hack/modalign -berth DIR [-keep REGEX]   (then: go mod tidy)
package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"regexp"
	"sort"
	"strings"

	"golang.org/x/mod/modfile"
	"golang.org/x/mod/module"
	"golang.org/x/mod/semver"
)

func main() {
	berthDir := flag.String("berth", "", "root of berth's module (its build list is the target)")
	keep := flag.String("keep", "", "modules (a regular expression on the path) that keep their own version")
	flag.Parse()
	if err := run(*berthDir, *keep, os.Stderr); err != nil {
		fmt.Fprintf(os.Stderr, "modalign: %v\n", err)
		os.Exit(1)
	}
}

func run(berthDir, keep string, out io.Writer) error {
	if berthDir == "" {
		return errors.New("-berth is required")
	}
	var keepRE *regexp.Regexp
	if keep != "" {
		var err error
		if keepRE, err = regexp.Compile(keep); err != nil {
			return fmt.Errorf("-keep: %w", err)
		}
	}
	target, err := buildList(berthDir)
	if err != nil {
		return fmt.Errorf("berth's build list: %w", err)
	}
	mine, err := buildList(".")
	if err != nil {
		return fmt.Errorf("this module's build list: %w", err)
	}
	data, err := os.ReadFile("go.mod")
	if err != nil {
		return err
	}
	f, err := modfile.Parse("go.mod", data, nil)
	if err != nil {
		return err
	}
	raised := raise(mine, target, keepRE)
	for _, m := range raised {
		if err := pin(f, m); err != nil {
			return err
		}
	}
	f.Cleanup()
	formatted, err := f.Format()
	if err != nil {
		return err
	}
	if err := os.WriteFile("go.mod", formatted, 0o644); err != nil {
		return err
	}
	fmt.Fprintf(out, "modalign: %d modules raised to berth's versions\n", len(raised))
	return nil
}

// raise returns the modules of mine whose version in target is higher,
// at target's version, sorted by path. A module matching keep, or with no
// valid version on either side (a replaced or local one), is left alone.
func raise(mine, target map[string]string, keep *regexp.Regexp) []module.Version {
	var out []module.Version
	for path, v := range mine {
		t, ok := target[path]
		if !ok || (keep != nil && keep.MatchString(path)) {
			continue
		}
		if !semver.IsValid(v) || !semver.IsValid(t) || semver.Compare(t, v) <= 0 {
			continue
		}
		out = append(out, module.Version{Path: path, Version: t})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Path < out[j].Path })
	return out
}

// pin makes m's version the one f selects: a replacement of the module
// by a version of itself (how sidecars pin k8s.io modules) is moved to
// it too, or it would still win over the requirement.
func pin(f *modfile.File, m module.Version) error {
	for _, r := range f.Replace {
		if r.Old.Path == m.Path && r.New.Path == m.Path && r.New.Version != "" {
			if err := f.AddReplace(r.Old.Path, r.Old.Version, m.Path, m.Version); err != nil {
				return fmt.Errorf("replace %s: %w", m, err)
			}
		}
	}
	if err := f.AddRequire(m.Path, m.Version); err != nil {
		return fmt.Errorf("require %s: %w", m, err)
	}
	return nil
}

// listed is what `go list -m -json` prints of one module.
type listed struct {
	Path    string
	Version string
	Main    bool
	Replace *struct{ Path, Version string }
}

// buildList is the selected version of every module in dir's build list,
// without the main module. A module replaced by a version of itself counts
// at that version; one replaced by another module or a folder is left out
// (its code is not the version's).
func buildList(dir string) (map[string]string, error) {
	cmd := exec.Command("go", "list", "-m", "-json", "all")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GOFLAGS=-mod=mod")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	b, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("go list -m all in %s: %w: %s", dir, err, strings.TrimSpace(stderr.String()))
	}
	return parseList(b)
}

func parseList(b []byte) (map[string]string, error) {
	out := map[string]string{}
	dec := json.NewDecoder(bytes.NewReader(b))
	for {
		var m listed
		if err := dec.Decode(&m); errors.Is(err, io.EOF) {
			return out, nil
		} else if err != nil {
			return nil, fmt.Errorf("go list output: %w", err)
		}
		v := m.Version
		if m.Replace != nil {
			if m.Replace.Path != m.Path || m.Replace.Version == "" {
				continue
			}
			v = m.Replace.Version
		}
		if m.Main {
			continue
		}
		out[m.Path] = v
	}
}
