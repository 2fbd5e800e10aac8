package main

import (
	"reflect"
	"regexp"
	"testing"

	"golang.org/x/mod/modfile"
	"golang.org/x/mod/module"
)

func TestRaise(t *testing.T) {
	mine := map[string]string{
		"golang.org/x/net":   "v0.38.0",
		"golang.org/x/sys":   "v0.35.0", // higher than berth's: stays
		"k8s.io/client-go":   "v0.33.2",
		"k8s.io/api":         "v0.33.2", // kept
		"example.com/only":   "v1.0.0",  // berth has none
		"example.com/pseudo": "v0.0.0-20240101000000-abcdefabcdef",
	}
	target := map[string]string{
		"golang.org/x/net":   "v0.41.0",
		"golang.org/x/sys":   "v0.33.0",
		"k8s.io/client-go":   "v0.34.4",
		"k8s.io/api":         "v0.34.4",
		"example.com/pseudo": "v0.0.0-20250101000000-abcdefabcdef",
		"example.com/other":  "v1.2.3",
	}
	got := raise(mine, target, regexp.MustCompile(`^k8s\.io/api$`))
	want := []module.Version{
		{Path: "example.com/pseudo", Version: "v0.0.0-20250101000000-abcdefabcdef"},
		{Path: "golang.org/x/net", Version: "v0.41.0"},
		{Path: "k8s.io/client-go", Version: "v0.34.4"},
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("raise = %v, want %v", got, want)
	}
}

func TestParseListSkipsMainAndReplacedByOthers(t *testing.T) {
	in := `{"Path":"berth.local/x","Main":true}
{"Path":"golang.org/x/net","Version":"v0.41.0"}
{"Path":"k8s.io/api","Version":"v0.0.0","Replace":{"Path":"k8s.io/api","Version":"v0.34.4"}}
{"Path":"example.com/fork","Version":"v1.0.0","Replace":{"Path":"example.com/other","Version":"v1.1.0"}}
{"Path":"example.com/local","Version":"v1.0.0","Replace":{"Path":"../local"}}
`
	got, err := parseList([]byte(in))
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"golang.org/x/net": "v0.41.0", "k8s.io/api": "v0.34.4"}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("parseList = %v, want %v", got, want)
	}
}

func TestPinMovesAVersionReplacement(t *testing.T) {
	in := `module example.com/sidecar

go 1.24

require k8s.io/apimachinery v0.33.0

replace k8s.io/apimachinery => k8s.io/apimachinery v0.33.0

replace example.com/local => ../local
`
	f, err := modfile.Parse("go.mod", []byte(in), nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := pin(f, module.Version{Path: "k8s.io/apimachinery", Version: "v0.34.4"}); err != nil {
		t.Fatal(err)
	}
	f.Cleanup()
	var got []string
	for _, r := range f.Require {
		got = append(got, "require "+r.Mod.String())
	}
	for _, r := range f.Replace {
		got = append(got, "replace "+r.Old.String()+" => "+r.New.String())
	}
	want := []string{
		"require k8s.io/apimachinery@v0.34.4",
		"replace k8s.io/apimachinery => k8s.io/apimachinery@v0.34.4",
		"replace example.com/local => ../local",
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("go.mod after pin:\n%v\nwant\n%v", got, want)
	}
}
