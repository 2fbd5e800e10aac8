package csi

import (
	"errors"
	"fmt"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/berth-io/berth/internal/agent"
	"github.com/berth-io/berth/internal/agent/errcode"
	"github.com/berth-io/berth/internal/backend"
	"github.com/berth-io/berth/internal/fence"
	"github.com/berth-io/berth/internal/keeper"
	"github.com/berth-io/berth/internal/mount"
	"github.com/berth-io/berth/internal/volerr"
)

// TestToStatus: the node service answers by the table the agent socket uses,
// with the codes the CSI spec names for what the agent returns.
func TestToStatus(t *testing.T) {
	held := &mount.HeldOpenError{Device: "/dev/loop3", Holders: []mount.Holder{{PID: 7, Command: "sh"}}}
	for _, tc := range []struct {
		err  error
		want codes.Code
	}{
		{agent.ErrBusy, codes.Aborted},
		{agent.ErrVolumeNotFound, codes.NotFound},
		{backend.ErrNotFound, codes.NotFound},
		{mount.ErrNotFound, codes.NotFound},
		{fmt.Errorf("stage v1: %w", agent.ErrWrongNode), codes.FailedPrecondition},
		{agent.ErrNotStaged, codes.FailedPrecondition},
		{agent.ErrClusterDeleting, codes.FailedPrecondition},
		{agent.ErrUnsupported, codes.FailedPrecondition},
		{mount.ErrInUse, codes.FailedPrecondition},
		{fmt.Errorf("unstage v1: %w", held), codes.FailedPrecondition},
		{&fence.ConflictError{Volume: "v1"}, codes.FailedPrecondition},
		{mount.ErrHoldsData, codes.FailedPrecondition},
		{mount.ErrExists, codes.AlreadyExists},
		{volerr.ErrInvalid, codes.InvalidArgument},
		{fence.ErrTooManyRetries, codes.Aborted},
		{fmt.Errorf("%w: %w", agent.ErrKeeperDown, keeper.ErrUnavailable), codes.Unavailable},
		{backend.ErrNoSpace, codes.ResourceExhausted},
		{errors.New("losetup: exit 1"), codes.Internal},
	} {
		got := status.Code(toStatus(tc.err))
		if got != tc.want || got != errcode.Code(tc.err) {
			t.Errorf("%v: %v (table %v), want %v", tc.err, got, errcode.Code(tc.err), tc.want)
		}
	}
}
