package agent

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	v1 "github.com/berth-io/berth/api/v1alpha1"
	"github.com/berth-io/berth/internal/agent/errcode"
	"github.com/berth-io/berth/internal/mount"
	"github.com/berth-io/berth/internal/volerr"
)

// Unit tests, with fakes, of the RWX filesystem paths: a workload's stage
// and unstage touch no device, its publish mounts the share over NFS (or is
// refused before anything is made on a node without an NFS client), and the
// share manager's own block stage stays the ordinary one. The refusal runs
// on the real kernel and mounter in TestRootPublishSharedRefusedWithoutNFS.

type nfsCheck struct{ err error }

func (c nfsCheck) Check() error { return c.err }

const shareEndpoint = "nfs://share-manager-vol-a.berth-system.svc/vol-a"

// newShareEnv is a stage env whose Volume vol-a is RWX filesystem on
// another node (the share may be mounted anywhere), its share in state
// with endpoint, and the node's NFS client answering nfsErr.
func newShareEnv(t *testing.T, state v1.ShareState, endpoint string, nfsErr error) (*stageEnv, string) {
	return newShareEnvAdmitting(t, state, endpoint, nfsErr, "node-a")
}

// newShareEnvAdmitting is newShareEnv with a share that admits nodes
// (the agent is node-a's).
func newShareEnvAdmitting(t *testing.T, state v1.ShareState, endpoint string, nfsErr error, admitted ...string) (*stageEnv, string) {
	t.Helper()
	e := newStageEnvOf(t, false, func(v *v1.Volume) {
		v.Spec.AccessMode = v1.ReadWriteMany
		v.Spec.Node = "node-b"
		v.Status.ShareState, v.Status.ShareEndpoint = state, endpoint
		if state == v1.ShareRunning {
			v.Status.ShareNodes = admitted
		}
	})
	e.cfg.NFS = nfsCheck{nfsErr}
	e.cfg.ShareWait = 50 * time.Millisecond
	e.agent = newTestAgent(t, e.cfg)
	return e, filepath.Join(t.TempDir(), "pod", "mount")
}

func (e *stageEnv) publishPod(t *testing.T, target string) error {
	t.Helper()
	return e.agent.Publish(t.Context(), PublishRequest{VolumeID: "vol-a", StagingPath: e.staging, TargetPath: target,
		Pod: Pod{Namespace: "default", Name: "web-0", UID: "uid-0"}})
}

func TestFakePublishShared(t *testing.T) {
	for _, c := range []struct {
		name      string
		state     v1.ShareState
		endpoint  string
		nfsErr    error
		code      codes.Code
		wantHold  bool
		wantMount string // the NFS source mounted; "": none
		// notAdmitted: the running share admits node-b only.
		notAdmitted bool
	}{
		{name: "share running", state: v1.ShareRunning, endpoint: shareEndpoint, code: codes.OK, wantHold: true,
			wantMount: "share-manager-vol-a.berth-system.svc:/vol-a"},
		// The pod's entry stays: it keeps the share needed while kubelet retries.
		{name: "share starting", state: v1.ShareStarting, endpoint: "", code: codes.Unavailable, wantHold: true},
		// Not on ganesha's client list yet: the mount would be refused and
		// drop the entry that gets the node listed; it waits instead.
		{name: "share running, node not admitted", state: v1.ShareRunning, endpoint: shareEndpoint, code: codes.Unavailable, wantHold: true, notAdmitted: true},
		{name: "share not started", code: codes.Unavailable, wantHold: true},
		{name: "no NFS client", state: v1.ShareRunning, endpoint: shareEndpoint, nfsErr: mount.ErrNoNFSClient, code: codes.FailedPrecondition},
		{name: "bad endpoint", state: v1.ShareRunning, endpoint: "http://x/vol-a", code: codes.InvalidArgument},
	} {
		t.Run(c.name, func(t *testing.T) {
			admit := "node-a"
			if c.notAdmitted {
				admit = "node-b"
			}
			e, target := newShareEnvAdmitting(t, c.state, c.endpoint, c.nfsErr, admit)
			err := e.publishPod(t, target)
			if got := errcode.Code(err); got != c.code {
				t.Fatalf("publish: %v (%s), want %s", err, got, c.code)
			}
			if hold := e.fence.holds["vol-a "+target]; hold != c.wantHold {
				t.Errorf("pod's Attachment entry: %t, want %t (holds %v)", hold, c.wantHold, e.fence.holds)
			}
			mps, _ := e.mounter.List()
			if c.wantMount == "" {
				if len(mps) != 0 {
					t.Errorf("mounts %v, want none", mps)
				}
				if _, err := os.Stat(target); !errors.Is(err, os.ErrNotExist) && c.nfsErr != nil {
					t.Errorf("target made by a refused publish: %v", err)
				}
				return
			}
			if len(mps) != 1 || mps[0].Device != c.wantMount || mps[0].Type != "nfs4" ||
				!slices.Contains(mps[0].Opts, "hard") || !slices.Contains(mps[0].Opts, "nfsvers=4.1") {
				t.Fatalf("mounts %+v, want %s as nfs4, hard, NFSv4.1", mps, c.wantMount)
			}
			if len(e.loop.devs) != 0 {
				t.Errorf("a workload's publish attached %v", e.loop.devs)
			}
			// A retry is success and mounts nothing more.
			if err := e.publishPod(t, target); err != nil {
				t.Fatalf("publish again: %v", err)
			}
			if mps, _ := e.mounter.List(); len(mps) != 1 {
				t.Errorf("mounts after a retry: %v", mps)
			}
			if err := e.agent.Unpublish(t.Context(), "vol-a", target); err != nil {
				t.Fatal(err)
			}
			if len(e.fence.holds) != 0 {
				t.Errorf("unpublish left holds %v", e.fence.holds)
			}
		})
	}
}

// A workload's stage and unstage of an RWX filesystem volume make and undo
// nothing; the share manager's block stage of the same volume on the same
// node is the ordinary one, and the workload's unstage leaves it alone.
func TestFakeStageShared(t *testing.T) {
	e, _ := newShareEnv(t, v1.ShareRunning, shareEndpoint, mount.ErrNoNFSClient)
	if err := e.stage(t); err != nil {
		t.Fatalf("workload stage: %v", err)
	}
	e.leftNothing(t, "a workload's stage")
	if e.exec.CommandCalls != 0 {
		t.Errorf("a workload's stage ran %d commands", e.exec.CommandCalls)
	}

	// The share manager's claim: the same handle, block mode, RWO. Its
	// image lives on node-b in this env, so it is refused here as any
	// device stage of another node's volume is...
	smStaging := filepath.Join(t.TempDir(), "sm-staging")
	err := e.agent.Stage(t.Context(), StageRequest{VolumeID: "vol-a", StagingPath: smStaging, Block: true})
	if !errors.Is(err, ErrWrongNode) {
		t.Fatalf("share manager's block stage on another node: %v, want %v", err, ErrWrongNode)
	}
	// ... and on its own node it attaches the device.
	e.cfg.Node = "node-b"
	e.agent = newTestAgent(t, e.cfg)
	if err := e.agent.Stage(t.Context(), StageRequest{VolumeID: "vol-a", StagingPath: smStaging, Block: true}); err != nil {
		t.Fatalf("share manager's block stage: %v", err)
	}
	if len(e.loop.devs) != 1 || !e.fence.holds["vol-a "+smStaging] {
		t.Fatalf("share manager's stage: loop devices %v, holds %v", e.loop.devs, e.fence.holds)
	}
	// The fake fence writes no Attachment: with none, a workload's unstage
	// is told apart by the volume alone, and must not detach the device.
	if err := e.agent.Unstage(t.Context(), "vol-a", e.staging); err != nil {
		t.Fatalf("workload unstage: %v", err)
	}
	if len(e.loop.devs) != 1 {
		t.Errorf("a workload's unstage detached the share manager's device: %v", e.loop.devs)
	}
}

// A workload's publish waits for the share to run; meanwhile the share
// manager's stage and unstage of the device on the same node must go
// through, or the share never runs. Under one lock for both, the device's
// stage got "another operation on this volume is in progress" for as long
// as the workload waited, again at each retry (seen on a VM node, where the
// image and the first pod shared a node: the share stayed "starting").
func TestFakeShareDeviceNotHeldUpByWaitingWorkload(t *testing.T) {
	e, target := newShareEnv(t, v1.ShareStarting, "", nil)
	e.cfg.Node = "node-b" // the image's node: the share manager runs here too
	e.cfg.ShareWait = time.Minute
	e.agent = newTestAgent(t, e.cfg)
	waiting := make(chan error, 1)
	go func() { waiting <- e.publishPod(t, target) }()
	// The workload's publish is waiting once its entry is written.
	deadline := time.Now().Add(10 * time.Second)
	for !e.fence.held("vol-a " + target) {
		if time.Now().After(deadline) {
			t.Fatal("the workload's publish wrote no entry")
		}
		time.Sleep(5 * time.Millisecond)
	}
	smStaging := filepath.Join(t.TempDir(), "sm-staging")
	if err := e.agent.Stage(t.Context(), StageRequest{VolumeID: "vol-a", ShareDevice: true, StagingPath: smStaging, Block: true}); err != nil {
		t.Fatalf("share manager's stage while a workload waits for the share: %v", err)
	}
	// Its unpublish (a target never published: nothing to undo) too.
	if err := e.agent.UnpublishShareDevice(t.Context(), "vol-a", filepath.Join(t.TempDir(), "sm-publish")); err != nil {
		t.Fatalf("share manager's unpublish while a workload waits for the share: %v", err)
	}
	if err := e.agent.Unstage(t.Context(), "vol-a", smStaging); err != nil {
		t.Fatalf("share manager's unstage while a workload waits for the share: %v", err)
	}
	select {
	case err := <-waiting:
		t.Fatalf("the workload's publish ended before the share ran: %v", err)
	default:
	}
	// Two publishes of one workload side still exclude each other.
	if err := e.publishPod(t, target+"-2"); !errors.Is(err, ErrBusy) {
		t.Errorf("a second workload publish while one waits: %v, want %v", err, ErrBusy)
	}
}

func TestNFSSource(t *testing.T) {
	for _, c := range []struct {
		endpoint, source string
		opts             []string
		bad              bool
	}{
		{endpoint: shareEndpoint, source: "share-manager-vol-a.berth-system.svc:/vol-a"},
		{endpoint: "nfs://10.0.0.7:2050/vol-a", source: "10.0.0.7:/vol-a", opts: []string{"port=2050"}},
		{endpoint: "nfs://[fd00::7]/vol-a", source: "[fd00::7]:/vol-a"},
		{endpoint: "nfs://host", bad: true},
		{endpoint: "nfs:///vol-a", bad: true},
		{endpoint: "https://host/vol-a", bad: true},
	} {
		src, opts, err := nfsSource(c.endpoint)
		if c.bad {
			if !errors.Is(err, volerr.ErrInvalid) {
				t.Errorf("%s: %q %v %v, want invalid", c.endpoint, src, opts, err)
			}
			continue
		}
		if err != nil || src != c.source || !slices.Equal(opts, c.opts) {
			t.Errorf("%s: %q %v %v, want %q %v", c.endpoint, src, opts, err, c.source, c.opts)
		}
	}
}
