package main

import (
	"reflect"
	"regexp"
	"testing"

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

func TestParseListSkipsMainAndReplaced(t *testing.T) {
	in := `{"Path":"berth.local/x","Main":true}
{"Path":"golang.org/x/net","Version":"v0.41.0"}
{"Path":"k8s.io/api","Version":"v0.0.0","Replace":{"Path":"k8s.io/api","Version":"v0.34.4"}}
`
	got, err := parseList([]byte(in))
	if err != nil {
		t.Fatal(err)
	}
	if want := map[string]string{"golang.org/x/net": "v0.41.0"}; !reflect.DeepEqual(got, want) {
		t.Fatalf("parseList = %v, want %v", got, want)
	}
}
