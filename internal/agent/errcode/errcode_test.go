package errcode

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"google.golang.org/grpc/codes"

	"github.com/berth-io/berth/internal/volerr"
)

// TestEveryKindHasOneRow: a new kind without a row would be Internal.
func TestEveryKindHasOneRow(t *testing.T) {
	seen := map[error]int{}
	for _, r := range Table() {
		seen[r.Kind]++
		if r.Why == "" {
			t.Errorf("%v: no reason given for %v", r.Kind, r.Code)
		}
	}
	for _, k := range volerr.Kinds() {
		if seen[k] != 1 {
			t.Errorf("kind %q has %d rows, want 1", k, seen[k])
		}
	}
	if len(Table()) != len(volerr.Kinds()) {
		t.Errorf("%d rows for %d kinds", len(Table()), len(volerr.Kinds()))
	}
}

func TestCode(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want codes.Code
	}{
		{nil, codes.OK},
		{volerr.ErrInvalid, codes.InvalidArgument},
		{volerr.ErrNotFound, codes.NotFound},
		{volerr.ErrExists, codes.AlreadyExists},
		{volerr.ErrWrongNode, codes.FailedPrecondition},
		{volerr.ErrInUse, codes.FailedPrecondition},
		{volerr.ErrPrecondition, codes.FailedPrecondition},
		{volerr.ErrNotReady, codes.Unavailable},
		{volerr.ErrUnavailable, codes.Unavailable},
		{volerr.ErrBusy, codes.Aborted},
		{volerr.ErrDenied, codes.PermissionDenied},
		{volerr.ErrNoSpace, codes.ResourceExhausted},
		{fmt.Errorf("stage v: %w", volerr.New(volerr.ErrWrongNode, "volume belongs to another node")), codes.FailedPrecondition},
		{fmt.Errorf("mount: %w", context.DeadlineExceeded), codes.DeadlineExceeded},
		{context.Canceled, codes.Canceled},
		{errors.New("losetup failed"), codes.Internal},
	} {
		if got := Code(tc.err); got != tc.want {
			t.Errorf("Code(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}

// TestKindRoundTrip: a code read back gives a kind of that code.
func TestKindRoundTrip(t *testing.T) {
	for _, r := range Table() {
		k := Kind(r.Code)
		if Code(k) != r.Code {
			t.Errorf("Kind(%v) = %v, which is %v", r.Code, k, Code(k))
		}
	}
	if Kind(codes.FailedPrecondition) != volerr.ErrPrecondition {
		t.Error("FailedPrecondition should read back as the generic precondition")
	}
	if Kind(codes.Internal) != nil || Kind(codes.OK) != nil {
		t.Error("codes of no kind read back as a kind")
	}
}
