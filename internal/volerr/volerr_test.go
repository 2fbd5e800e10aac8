package volerr

import (
	"errors"
	"fmt"
	"testing"
)

func TestNewIsItselfAndItsKind(t *testing.T) {
	own := New(ErrNotFound, "image not found")
	other := New(ErrNotFound, "image not found")
	err := fmt.Errorf("get vol1: %w", own)
	if !errors.Is(err, own) || !errors.Is(err, ErrNotFound) {
		t.Fatalf("%v: want both the sentinel and its kind", err)
	}
	if errors.Is(err, other) {
		t.Fatal("two sentinels of one kind must stay apart")
	}
	if own.Error() != "image not found" {
		t.Fatalf("text %q", own.Error())
	}
	if KindOf(err) != ErrNotFound || KindOf(errors.New("x")) != nil {
		t.Fatal("KindOf")
	}
}
