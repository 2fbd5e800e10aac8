//go:build ceph

package cephaddr

import (
	"slices"
	"testing"
)

func TestParse(t *testing.T) {
	for in, want := range map[string][]string{
		"127.0.0.1:0/3701837422":                  {"127.0.0.1:0/3701837422"},
		"[v2:10.0.0.1:0/42,v1:10.0.0.1:0/42]":     {"10.0.0.1:0/42"},
		"[v2:[fd00::1]:0/7,v1:[fd00::1]:0/7]":     {"[fd00::1]:0/7"},
		"[any:10.0.0.2:0/9]":                      {"10.0.0.2:0/9"},
		"[v2:10.0.0.1:6800/1,v1:10.0.0.1:6801/1]": {"10.0.0.1:6800/1", "10.0.0.1:6801/1"},
	} {
		if got, err := Parse(in); err != nil || !slices.Equal(got, want) {
			t.Errorf("Parse(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "[]", "10.0.0.1:0"} {
		if got, err := Parse(bad); err == nil {
			t.Errorf("Parse(%q) = %q, want an error", bad, got)
		}
	}
}
