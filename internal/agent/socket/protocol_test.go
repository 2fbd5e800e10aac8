package socket

import (
	"errors"
	"fmt"
	"testing"

	"google.golang.org/grpc/codes"

	"github.com/berth-io/berth/internal/agent"
	"github.com/berth-io/berth/internal/agent/errcode"
	"github.com/berth-io/berth/internal/fence"
	"github.com/berth-io/berth/internal/mount"
	"github.com/berth-io/berth/internal/volerr"
)

// TestCodesAreGRPCNames: the codes the server sets itself are names of the
// table's codes, as version 2 says.
func TestCodesAreGRPCNames(t *testing.T) {
	for code, want := range map[string]codes.Code{
		CodeInvalid: codes.InvalidArgument, CodeBusy: codes.Aborted, CodeDenied: codes.PermissionDenied,
		CodeInternal: codes.Internal, CodeNotReady: codes.Unavailable,
	} {
		if code != want.String() {
			t.Errorf("%q is not %v's name", code, want)
		}
	}
	if CodeBusy != codeOf(agent.ErrBusy) || CodeNotReady != codeOf(volerr.ErrNotReady) || CodeInvalid != codeOf(volerr.ErrInvalid) {
		t.Error("the server's own codes disagree with the table")
	}
}

// TestSocketAnswersLikeCSI: every error the agent returns gets the code of
// the table, including the two that used to differ between the boundaries.
func TestSocketAnswersLikeCSI(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want codes.Code
	}{
		{fmt.Errorf("stage: %w", agent.ErrWrongNode), codes.FailedPrecondition},
		{fmt.Errorf("stage: %w", mount.ErrExists), codes.AlreadyExists},
		{&mount.HeldOpenError{Device: "/dev/loop3", Holders: []mount.Holder{{PID: 7}}}, codes.FailedPrecondition},
		{&fence.ConflictError{Volume: "v"}, codes.FailedPrecondition},
		{agent.ErrNotOwned, codes.PermissionDenied},
	} {
		if got := codeOf(tc.err); got != tc.want.String() || errcode.Code(tc.err) != tc.want {
			t.Errorf("%v: socket %s, table %v, want %v", tc.err, got, errcode.Code(tc.err), tc.want)
		}
	}
	for _, k := range volerr.Kinds() {
		if codeOf(k) != errcode.Code(k).String() {
			t.Errorf("%v: socket %s, table %v", k, codeOf(k), errcode.Code(k))
		}
	}
}

// TestReplyErrReadsBothVersions: a driver reads an agent of either
// protocol version: version 1's own codes and version 2's gRPC names.
func TestReplyErrReadsBothVersions(t *testing.T) {
	v1 := map[string]error{"Invalid": volerr.ErrInvalid, "Busy": volerr.ErrBusy, "Conflict": volerr.ErrInUse,
		"NotFound": volerr.ErrNotFound, "Denied": volerr.ErrDenied, "NotReady": volerr.ErrNotReady, "Internal": nil}
	v2 := map[string]error{"InvalidArgument": volerr.ErrInvalid, "Aborted": volerr.ErrBusy,
		"FailedPrecondition": volerr.ErrPrecondition, "AlreadyExists": volerr.ErrExists, "Unavailable": volerr.ErrUnavailable,
		"PermissionDenied": volerr.ErrDenied, "ResourceExhausted": volerr.ErrNoSpace, "made-up": nil}
	for code, kind := range v1 {
		v2[code] = kind
	}
	for code, kind := range v2 {
		err := Response{Code: code, Message: "m"}.Err()
		var reply *ReplyError
		if !errors.As(err, &reply) || err.Error() != code+": m" {
			t.Errorf("%s: %v is not the reply", code, err)
		}
		if got := volerr.KindOf(err); got != kind {
			t.Errorf("%s read as %v, want %v", code, got, kind)
		}
	}
	if err := (Response{OK: true, Version: 1}).Err(); err != nil {
		t.Errorf("OK reply: %v", err)
	}
}
