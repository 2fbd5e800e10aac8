package network

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/vishvananda/netns"
)

// fakeSwitcher records the namespaces a thread is set to.
type fakeSwitcher struct {
	sets   []netns.NsHandle
	setErr map[netns.NsHandle]error
}

func (f *fakeSwitcher) Get() (netns.NsHandle, error) { return netns.NsHandle(-7), nil }

func (f *fakeSwitcher) Set(ns netns.NsHandle) error {
	f.sets = append(f.sets, ns)
	return f.setErr[ns]
}

func TestInNamespaceEntersAndLeaves(t *testing.T) {
	sw := &fakeSwitcher{}
	fnErr := errors.New("fn")
	ran := false
	err := NewInNamespace(sw).Do(netns.NsHandle(-3), func() error { ran = true; return fnErr })
	if !ran || !errors.Is(err, fnErr) {
		t.Errorf("Do: ran %v, %v", ran, err)
	}
	if len(sw.sets) != 2 || sw.sets[0] != -3 || sw.sets[1] != -7 {
		t.Errorf("set %v, want the target then the thread's own namespace", sw.sets)
	}
}

func TestInNamespaceFailures(t *testing.T) {
	sw := &fakeSwitcher{setErr: map[netns.NsHandle]error{-3: errors.New("EPERM")}}
	ran := false
	if err := NewInNamespace(sw).Do(-3, func() error { ran = true; return nil }); err == nil || ran {
		t.Errorf("enter failure: ran %v, %v", ran, err)
	}
	sw = &fakeSwitcher{setErr: map[netns.NsHandle]error{-7: errors.New("EINVAL")}}
	if err := NewInNamespace(sw).Do(-3, func() error { return nil }); err == nil || !strings.Contains(err.Error(), "thread discarded") {
		t.Errorf("leave failure: %v", err)
	}
	if _, err := NewInNamespace(sw).Dial(context.Background(), -3, "tcp", "storage.example:6789"); err == nil || !strings.Contains(err.Error(), "not a name") {
		t.Errorf("dial by name: %v", err)
	}
}
