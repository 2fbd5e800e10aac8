package ceph_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	v1 "github.com/berth-io/berth/api/v1alpha1"
	"github.com/berth-io/berth/internal/backend/ceph"
)

func TestMonHost(t *testing.T) {
	lookup := func(_ context.Context, host string) ([]string, error) {
		if host == "mon.example" {
			return []string{"10.0.0.7", "fd00::7"}, nil
		}
		return nil, errors.New("no such host")
	}
	for _, tc := range []struct {
		in   []string
		want string
		err  error
	}{
		{[]string{"10.0.0.1:3300"}, "[v2:10.0.0.1:3300]", nil},
		{[]string{"10.0.0.1:6789", "[fd00::1]:3310"}, "[v1:10.0.0.1:6789],[v2:[fd00::1]:3310]", nil},
		{[]string{"v1:10.0.0.1:3300", "v2:10.0.0.2:6789"}, "[v1:10.0.0.1:3300],[v2:10.0.0.2:6789]", nil},
		{[]string{"mon.example:3300"}, "[v2:10.0.0.7:3300],[v2:[fd00::7]:3300]", nil},
		{[]string{"mon.nowhere:3300"}, "", ceph.ErrMonitorsUnreachable},
		{[]string{"10.0.0.1"}, "", nil},
		{nil, "", nil},
	} {
		got, err := ceph.MonHost(context.Background(), tc.in, lookup)
		switch {
		case tc.want != "" && (err != nil || got != tc.want):
			t.Errorf("MonHost(%q) = %q, %v; want %q", tc.in, got, err, tc.want)
		case tc.want == "" && err == nil:
			t.Errorf("MonHost(%q) = %q, want an error", tc.in, got)
		case tc.err != nil && !errors.Is(err, tc.err):
			t.Errorf("MonHost(%q): %v, want %v", tc.in, err, tc.err)
		}
	}
}

func TestConfigFor(t *testing.T) {
	spec := &v1.CephSpec{
		Monitors: []v1.CephMonitor{"10.0.0.1:3300", "10.0.0.2:6789"}, Pool: "rbd", DataPool: "ec",
		ImageFeatures: []v1.CephImageFeature{"layering", "exclusive-lock", "object-map"},
	}
	cfg, err := ceph.ConfigFor(context.Background(), spec, "client.berth", "SECRET", nil)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Monitors != "[v2:10.0.0.1:3300],[v1:10.0.0.2:6789]" || cfg.Pool != "rbd" || cfg.DataPool != "ec" ||
		cfg.Client != "berth" || cfg.Key != "SECRET" || len(cfg.Features) != 3 || cfg.Features[2] != "object-map" {
		t.Errorf("config %+v", cfg)
	}
	if s := cfg.String(); strings.Contains(s, "SECRET") {
		t.Errorf("String shows the key: %s", s)
	}
}
