package csi

import (
	"context"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/go-logr/logr"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/berth-io/berth/api/v1alpha1"
	"github.com/berth-io/berth/internal/agent/errcode"
	"github.com/berth-io/berth/internal/volerr"
)

const (
	defaultVolumeSize = 1 << 30
	sizeAlign         = 1 << 20
	// ParamMounter selects kernel or userspace in StorageClass parameters.
	ParamMounter = "mounter"
	// ParamFSType is the fs type parameter Kubernetes documents for CSI.
	ParamFSType = "csi.storage.k8s.io/fstype"
	// ParamRootSquash "true" makes an RWX volume's share map root to the
	// anonymous user (v1.VolumeSpec.RootSquash).
	ParamRootSquash = "rootSquash"
	// reasonNoSpace is the Ready condition reason an agent sets when the
	// image does not fit.
	reasonNoSpace = "NoSpace"
	// reasonSourceInUse: the agent could not hold a snapshot's or clone's
	// source still for the copy.
	reasonSourceInUse = "SourceInUse"
)

// ControllerConfig configures the Controller service.
type ControllerConfig struct {
	// Namespace is berth's: it holds the agents' CSIStorageCapacity objects
	// and the ceph StorageClusters' Secrets.
	Namespace string
	// Wait bounds how long a call waits for the agent (on top of the caller's deadline).
	Wait time.Duration
	// Poll is how often the controller looks at the object it waits for.
	Poll time.Duration
	// OpenCeph connects to a ceph StorageCluster's Ceph (nil: ceph.Open);
	// LookupHost resolves monitor host names (nil: the system resolver).
	OpenCeph   OpenCeph
	LookupHost func(ctx context.Context, host string) ([]string, error)
}

// Controller is the CSI Controller service. It records the wanted volume in
// the API server and waits for the agent of the chosen node to make it, so
// that a restart of either side loses nothing.
type Controller struct {
	csi.UnimplementedControllerServer
	c    client.Client
	cfg  ControllerConfig
	log  logr.Logger
	ceph *cephStores
	busy busyIDs
}

// The CSI controller's RBAC (generated into config/rbac/csi-controller).
// +kubebuilder:rbac:groups=berth.io,resources=volumes,verbs=get;list;watch;create;update;delete
// +kubebuilder:rbac:groups=berth.io,resources=snapshots,verbs=get;list;watch;create;delete
// +kubebuilder:rbac:groups=berth.io,resources=storageclusters,verbs=get
// +kubebuilder:rbac:groups=berth.io,resources=volumes/status;snapshots/status,verbs=update
// +kubebuilder:rbac:groups=berth.io,resources=snapshots,verbs=update
// +kubebuilder:rbac:groups="",namespace=berth-system,resources=secrets,verbs=get
// +kubebuilder:rbac:groups="",resources=nodes,verbs=get;list
// +kubebuilder:rbac:groups=storage.k8s.io,namespace=berth-system,resources=csistoragecapacities,verbs=get;list

// NewController returns the Controller service.
func NewController(c client.Client, cfg ControllerConfig, log logr.Logger) *Controller {
	if cfg.Wait == 0 {
		cfg.Wait = 2 * time.Minute
	}
	if cfg.Poll == 0 {
		cfg.Poll = 50 * time.Millisecond
	}
	stores := &cephStores{open: cfg.OpenCeph, lookup: cfg.LookupHost, namespace: cfg.Namespace, log: log.WithName("ceph")}
	return &Controller{c: c, cfg: cfg, log: log, ceph: stores}
}

// ControllerGetCapabilities implements csi.ControllerServer.
func (s *Controller) ControllerGetCapabilities(context.Context, *csi.ControllerGetCapabilitiesRequest) (*csi.ControllerGetCapabilitiesResponse, error) {
	var caps []*csi.ControllerServiceCapability
	for _, t := range []csi.ControllerServiceCapability_RPC_Type{
		csi.ControllerServiceCapability_RPC_CREATE_DELETE_VOLUME,
		csi.ControllerServiceCapability_RPC_LIST_VOLUMES,
		csi.ControllerServiceCapability_RPC_GET_CAPACITY,
		csi.ControllerServiceCapability_RPC_EXPAND_VOLUME,
		csi.ControllerServiceCapability_RPC_CREATE_DELETE_SNAPSHOT,
		csi.ControllerServiceCapability_RPC_LIST_SNAPSHOTS,
		csi.ControllerServiceCapability_RPC_CLONE_VOLUME,
		// Without it the external-provisioner hands ReadWriteOncePod claims
		// over as SINGLE_NODE_WRITER, and berth would fence them as RWO.
		csi.ControllerServiceCapability_RPC_SINGLE_NODE_MULTI_WRITER,
	} {
		caps = append(caps, &csi.ControllerServiceCapability{Type: &csi.ControllerServiceCapability_Rpc{Rpc: &csi.ControllerServiceCapability_RPC{Type: t}}})
	}
	return &csi.ControllerGetCapabilitiesResponse{Capabilities: caps}, nil
}

// CreateVolume implements csi.ControllerServer.
func (s *Controller) CreateVolume(ctx context.Context, req *csi.CreateVolumeRequest) (*csi.CreateVolumeResponse, error) {
	if req.GetName() == "" {
		return nil, status.Error(codes.InvalidArgument, "name missing")
	}
	mode, volMode, fsType, err := checkCapabilities(req.GetVolumeCapabilities())
	if err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	if mode == v1.ReadWriteMany && volMode == v1.VolumeModeBlock {
		// RWX is served by a share manager over NFS, which exports a
		// filesystem; nothing would serve a shared raw device.
		return nil, status.Error(codes.InvalidArgument, "ReadWriteMany needs volumeMode Filesystem: berth shares RWX volumes over NFS, which cannot serve a raw block device")
	}
	mounter, paramFS, err := parseParameters(req.GetParameters())
	if err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	sc, err := s.storageCluster(ctx, req.GetParameters())
	if err != nil {
		return nil, err
	}
	cluster := sc.Name
	if fsType == "" {
		fsType = paramFS
	}
	if volMode == v1.VolumeModeBlock {
		fsType = ""
	} else if fsType == "" {
		fsType = "ext4"
	}
	size, err := requestedSize(req.GetCapacityRange())
	if err != nil {
		return nil, status.Error(codes.OutOfRange, err.Error())
	}

	spec := v1.VolumeSpec{
		StorageCluster: cluster, AccessMode: mode, VolumeMode: volMode,
		FSType: fsType, Mounter: mounter, RootSquash: req.GetParameters()[ParamRootSquash] == "true",
	}
	if err := s.resolveSource(ctx, req.GetVolumeContentSource(), &spec, &size, req.GetCapacityRange()); err != nil {
		return nil, err
	}
	if err := checkFSSize(fsType, size); err != nil {
		return nil, status.Error(codes.OutOfRange, err.Error())
	}
	spec.Size = *resource.NewQuantity(size, resource.BinarySI)
	if sc.Spec.Backend == v1.BackendCeph {
		return s.createCephVolume(ctx, req, spec, size)
	}

	name := objectName("vol", req.GetName())
	vol := &v1.Volume{}
	err = s.c.Get(ctx, client.ObjectKey{Name: name}, vol)
	switch {
	case apierrors.IsNotFound(err):
		if spec.Node == "" {
			if spec.Node, err = s.chooseNode(ctx, req.GetAccessibilityRequirements(), size); err != nil {
				return nil, err
			}
		}
		vol = &v1.Volume{ObjectMeta: metav1.ObjectMeta{
			Name:        name,
			Labels:      map[string]string{v1.NodeLabel: spec.Node},
			Annotations: map[string]string{v1.CSINameAnnotation: req.GetName()},
		}, Spec: spec}
		if err := s.c.Create(ctx, vol); err != nil && !apierrors.IsAlreadyExists(err) {
			return nil, status.Errorf(codes.Internal, "create Volume %s: %v", name, err)
		}
	case err != nil:
		return nil, status.Errorf(codes.Unavailable, "get Volume %s: %v", name, err)
	default:
		if err := sameVolume(vol, &spec); err != nil {
			return nil, status.Errorf(codes.AlreadyExists, "volume %q exists with other parameters: %v", req.GetName(), err)
		}
	}

	vol, err = s.waitVolume(ctx, name, func(v *v1.Volume) bool {
		return v.Status.State == v1.VolumeAvailable || v.Status.State == v1.VolumeError
	})
	if err != nil {
		return nil, err
	}
	if vol.Status.State == v1.VolumeError {
		return nil, s.failedCreate(ctx, vol)
	}
	return &csi.CreateVolumeResponse{Volume: csiVolume(vol, req.GetVolumeContentSource())}, nil
}

// failedCreate removes a Volume whose image the agent could not make, so a
// refused request leaves nothing behind, and names the agent's reason.
func (s *Controller) failedCreate(ctx context.Context, vol *v1.Volume) error {
	return s.removeFailed(ctx, vol, vol.Status.Conditions, "node %s could not create volume %s: %s", vol.Spec.Node, vol.Name, vol.Status.Message)
}

// removeFailed deletes obj, which its agent could not make, and returns
// the error for the call: ResourceExhausted when the node lacked space.
func (s *Controller) removeFailed(ctx context.Context, obj client.Object, conds []metav1.Condition, format string, args ...any) error {
	if err := s.c.Delete(ctx, obj); err != nil && !apierrors.IsNotFound(err) {
		s.log.Error(err, "remove what a failed create made", "name", obj.GetName())
	}
	// The agent's error is gone by now; its condition's reason says the kind.
	var kind error
	if c := meta.FindStatusCondition(conds, v1.ConditionReady); c != nil {
		switch c.Reason {
		case reasonNoSpace:
			kind = volerr.ErrNoSpace
		case reasonSourceInUse:
			kind = volerr.ErrInUse
		}
	}
	code := codes.Internal
	if kind != nil {
		code = errcode.Code(kind)
	}
	return status.Errorf(code, format, args...)
}

func parseParameters(params map[string]string) (v1.Mounter, string, error) {
	mounter := v1.MounterKernel
	var fsType string
	for k, v := range params {
		switch {
		case k == ParamMounter:
			switch v1.Mounter(v) {
			case v1.MounterKernel, v1.MounterUserspace:
				mounter = v1.Mounter(v)
			default:
				return "", "", fmt.Errorf("parameter %s=%q: want kernel or userspace", k, v)
			}
		case k == ParamFSType:
			if err := checkFSType(v); err != nil {
				return "", "", fmt.Errorf("parameter %s: %w", k, err)
			}
			fsType = v
		case k == ParamRootSquash:
			if v != "true" && v != "false" {
				return "", "", fmt.Errorf("parameter %s=%q: want true or false", k, v)
			}
		case k == v1.ParamStorageCluster:
			// Read by storageCluster.
		case strings.HasPrefix(k, "csi.storage.k8s.io/"):
			// Kubernetes' own metadata (PVC name, namespace, ...).
		default:
			return "", "", fmt.Errorf("unknown parameter %q (known: %s, %s, %s, %s)", k, ParamMounter, ParamFSType, ParamRootSquash, v1.ParamStorageCluster)
		}
	}
	return mounter, fsType, nil
}

// storageCluster returns the StorageCluster a new volume belongs to: the
// class names it (one CSI controller serves every cluster). A cluster that
// does not exist or is being deleted gets no new volume.
func (s *Controller) storageCluster(ctx context.Context, params map[string]string) (*v1.StorageCluster, error) {
	name := params[v1.ParamStorageCluster]
	if name == "" {
		return nil, status.Errorf(codes.InvalidArgument, "StorageClass parameter %s missing: it names the StorageCluster the volume belongs to", v1.ParamStorageCluster)
	}
	sc := &v1.StorageCluster{}
	err := s.c.Get(ctx, client.ObjectKey{Name: name}, sc)
	switch {
	case apierrors.IsNotFound(err):
		return nil, status.Errorf(codes.InvalidArgument, "StorageClass parameter %s: StorageCluster %q does not exist", v1.ParamStorageCluster, name)
	case err != nil:
		return nil, status.Errorf(codes.Unavailable, "get StorageCluster %s: %v", name, err)
	case !sc.DeletionTimestamp.IsZero():
		return nil, status.Errorf(codes.FailedPrecondition, "StorageCluster %s is being deleted: no new volumes", name)
	}
	return sc, nil
}

func requestedSize(r *csi.CapacityRange) (int64, error) {
	req, limit := r.GetRequiredBytes(), r.GetLimitBytes()
	if req < 0 || limit < 0 {
		return 0, fmt.Errorf("capacity range must not be negative")
	}
	size := req
	if size == 0 {
		size = defaultVolumeSize
		if limit > 0 && limit < size {
			size = limit
		}
	}
	size = (size + sizeAlign - 1) / sizeAlign * sizeAlign
	if limit > 0 && size > limit {
		if req > limit {
			return 0, fmt.Errorf("required bytes %d exceed limit bytes %d", req, limit)
		}
		size = limit // the limit is not 1 MiB aligned: honour it exactly
	}
	return size, nil
}

// minXFSSize is the smallest filesystem mkfs.xfs makes (xfsprogs 5.19 and
// later refuse 299 MiB): a smaller xfs volume would be provisioned and then
// fail at every stage.
const minXFSSize = 300 << 20

// checkFSSize refuses a volume too small for its fs type ("" for block).
func checkFSSize(fsType string, size int64) error {
	if fsType == "xfs" && size < minXFSSize {
		return fmt.Errorf("fsType xfs needs at least 300 MiB (mkfs.xfs makes no smaller filesystem), asked %d bytes", size)
	}
	return nil
}

// sameVolume tells whether an existing volume answers a repeated request.
func sameVolume(vol *v1.Volume, spec *v1.VolumeSpec) error {
	switch {
	case vol.Spec.Size.Value() != spec.Size.Value():
		return fmt.Errorf("size %s, asked %s", vol.Spec.Size.String(), spec.Size.String())
	case vol.Spec.VolumeMode != spec.VolumeMode:
		return fmt.Errorf("volume mode %s, asked %s", vol.Spec.VolumeMode, spec.VolumeMode)
	case vol.Spec.Mounter != spec.Mounter:
		return fmt.Errorf("mounter %s, asked %s", vol.Spec.Mounter, spec.Mounter)
	case vol.Spec.AccessMode != spec.AccessMode:
		return fmt.Errorf("access mode %s, asked %s", vol.Spec.AccessMode, spec.AccessMode)
	case vol.Spec.FSType != spec.FSType:
		return fmt.Errorf("fs type %s, asked %s", vol.Spec.FSType, spec.FSType)
	case vol.Spec.RootSquash != spec.RootSquash:
		return fmt.Errorf("root squash %t, asked %t", vol.Spec.RootSquash, spec.RootSquash)
	case !sameSource(vol.Spec.Source, spec.Source):
		return fmt.Errorf("other content source")
	}
	return nil
}

func sameSource(a, b *v1.VolumeSource) bool {
	if a == nil || b == nil {
		return a == b
	}
	return *a == *b
}

// DeleteVolume implements csi.ControllerServer. It returns once the agent
// removed the image.
func (s *Controller) DeleteVolume(ctx context.Context, req *csi.DeleteVolumeRequest) (*csi.DeleteVolumeResponse, error) {
	vol := &v1.Volume{}
	err := s.deleteObject(ctx, "Volume", req.GetVolumeId(), vol, func() string { return vol.Spec.Node },
		func(ctx context.Context) error { return s.deleteCephVolume(ctx, vol) })
	return answer(&csi.DeleteVolumeResponse{}, err)
}

// answer is resp, or no response but err.
func answer[T any](resp *T, err error) (*T, error) {
	if err != nil {
		return nil, err
	}
	return resp, nil
}

// deleteObject deletes the Volume or Snapshot obj named id as CSI wants it,
// idempotent (an ID berth never makes, or an object already gone, is
// deleted), and returns once the agent removed its image; a ceph one (node
// says where it lives, once read) goes through deleteCeph instead.
func (s *Controller) deleteObject(ctx context.Context, kind, id string, obj client.Object, node func() string, deleteCeph func(context.Context) error) error {
	if id == "" {
		return status.Errorf(codes.InvalidArgument, "%s ID missing", strings.ToLower(kind))
	}
	switch _, err := getObject(ctx, s, kind, id, obj); {
	case status.Code(err) == codes.NotFound:
		return nil // gone, or never made: an ID berth does not make
	case err != nil:
		return err
	case inCeph(node()):
		return deleteCeph(ctx)
	}
	if err := s.c.Delete(ctx, obj); err != nil {
		if apierrors.IsNotFound(err) {
			return nil
		}
		return status.Errorf(codes.Internal, "delete %s %s: %v", kind, id, err)
	}
	return s.waitGone(ctx, obj)
}

// ValidateVolumeCapabilities implements csi.ControllerServer.
func (s *Controller) ValidateVolumeCapabilities(ctx context.Context, req *csi.ValidateVolumeCapabilitiesRequest) (*csi.ValidateVolumeCapabilitiesResponse, error) {
	if req.GetVolumeId() == "" {
		return nil, status.Error(codes.InvalidArgument, "volume ID missing")
	}
	if len(req.GetVolumeCapabilities()) == 0 {
		return nil, status.Error(codes.InvalidArgument, "volume capabilities missing")
	}
	vol, err := s.getVolume(ctx, req.GetVolumeId())
	if err != nil {
		return nil, err
	}
	// Not confirming, with a message, is the spec's answer to capabilities
	// the volume cannot serve; an error would mean the call itself failed.
	if _, _, err := parseParameters(req.GetParameters()); err != nil {
		return &csi.ValidateVolumeCapabilitiesResponse{Message: err.Error()}, nil //nolint:nilerr
	}
	if err := capabilitiesFit(vol, req.GetVolumeCapabilities()); err != nil {
		return &csi.ValidateVolumeCapabilitiesResponse{Message: err.Error()}, nil //nolint:nilerr
	}
	return &csi.ValidateVolumeCapabilitiesResponse{Confirmed: &csi.ValidateVolumeCapabilitiesResponse_Confirmed{
		VolumeContext:      req.GetVolumeContext(),
		VolumeCapabilities: req.GetVolumeCapabilities(),
		Parameters:         req.GetParameters(),
	}}, nil
}

// ListVolumes implements csi.ControllerServer; the token is an offset into
// the volumes sorted by name.
func (s *Controller) ListVolumes(ctx context.Context, req *csi.ListVolumesRequest) (*csi.ListVolumesResponse, error) {
	vols := &v1.VolumeList{}
	if err := s.c.List(ctx, vols); err != nil {
		return nil, status.Errorf(codes.Unavailable, "list volumes: %v", err)
	}
	sort.Slice(vols.Items, func(i, j int) bool { return vols.Items[i].Name < vols.Items[j].Name })
	start, end, next, err := page(len(vols.Items), req.GetStartingToken(), req.GetMaxEntries())
	if err != nil {
		return nil, err
	}
	resp := &csi.ListVolumesResponse{NextToken: next}
	for i := start; i < end; i++ {
		v := &vols.Items[i]
		resp.Entries = append(resp.Entries, &csi.ListVolumesResponse_Entry{
			Volume: csiVolume(v, nil),
			Status: &csi.ListVolumesResponse_VolumeStatus{VolumeCondition: volumeCondition(v)},
		})
	}
	return resp, nil
}

// page turns a starting token and a maximum into a slice range and the next token.
func page(n int, token string, maxEntries int32) (start, end int, next string, err error) {
	if maxEntries < 0 {
		return 0, 0, "", status.Error(codes.InvalidArgument, "max_entries must not be negative")
	}
	if token != "" {
		start, err = strconv.Atoi(token)
		if err != nil || start < 0 || start > n {
			return 0, 0, "", status.Errorf(codes.Aborted, "starting token %q is not valid", token)
		}
	}
	end = n
	if maxEntries > 0 && start+int(maxEntries) < n {
		end = start + int(maxEntries)
		next = strconv.Itoa(end)
	}
	return start, end, next, nil
}

// ControllerExpandVolume implements csi.ControllerServer: it raises the
// Volume's size and waits for the agent to grow the image; the node then
// grows the device and filesystem.
func (s *Controller) ControllerExpandVolume(ctx context.Context, req *csi.ControllerExpandVolumeRequest) (*csi.ControllerExpandVolumeResponse, error) {
	if req.GetVolumeId() == "" {
		return nil, status.Error(codes.InvalidArgument, "volume ID missing")
	}
	if req.GetCapacityRange() == nil {
		return nil, status.Error(codes.InvalidArgument, "capacity range missing")
	}
	size, err := requestedSize(req.GetCapacityRange())
	if err != nil {
		return nil, status.Error(codes.OutOfRange, err.Error())
	}
	vol, err := s.getVolume(ctx, req.GetVolumeId())
	if err != nil {
		return nil, err
	}
	if inCeph(vol.Spec.Node) {
		return s.expandCephVolume(ctx, vol, size)
	}
	if err := s.growSpec(ctx, vol, size); err != nil {
		return nil, err
	}
	want := vol.Spec.Size.Value()
	vol, err = s.waitVolume(ctx, vol.Name, func(v *v1.Volume) bool {
		return (v.Status.Capacity != nil && v.Status.Capacity.Value() >= want) || v.Status.State == v1.VolumeError
	})
	if err != nil {
		return nil, err
	}
	if vol.Status.State == v1.VolumeError {
		return nil, status.Errorf(codes.ResourceExhausted, "node %s could not grow volume %s: %s", vol.Spec.Node, vol.Name, vol.Status.Message)
	}
	return &csi.ControllerExpandVolumeResponse{CapacityBytes: vol.Status.Capacity.Value(), NodeExpansionRequired: true}, nil
}

// growSpec raises vol's spec.size to at least size.
func (s *Controller) growSpec(ctx context.Context, vol *v1.Volume, size int64) error {
	err := s.updateVolume(ctx, vol, func() error {
		if vol.Spec.Size.Value() >= size {
			return nil
		}
		vol.Spec.Size = *resource.NewQuantity(size, resource.BinarySI)
		return s.c.Update(ctx, vol)
	})
	switch {
	case err == nil:
		return nil
	case apierrors.IsConflict(err):
		return status.Errorf(codes.Aborted, "volume %s kept changing meanwhile, retry: %v", vol.Name, err)
	case apierrors.IsNotFound(err):
		return status.Errorf(codes.NotFound, "volume %s deleted meanwhile", vol.Name)
	}
	return status.Errorf(codes.Internal, "update Volume %s: %v", vol.Name, err)
}

// updateVolume runs write, which changes vol and writes it, again on a
// conflict, with vol read anew. The agent writes a Volume's status while
// the controller changes it (a slow node, seen under emulation): a
// conflict is no reason to fail the call.
func (s *Controller) updateVolume(ctx context.Context, vol *v1.Volume, write func() error) error {
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		err := write()
		if apierrors.IsConflict(err) {
			if gerr := s.c.Get(ctx, client.ObjectKeyFromObject(vol), vol); gerr != nil {
				return gerr
			}
		}
		return err
	})
}

func (s *Controller) getVolume(ctx context.Context, id string) (*v1.Volume, error) {
	return getObject(ctx, s, "Volume", id, &v1.Volume{})
}

// getObject reads into obj the Volume or Snapshot (kind) named id: NotFound
// for an ID berth never makes too, Unavailable when the API server fails.
func getObject[T client.Object](ctx context.Context, s *Controller, kind, id string, obj T) (T, error) {
	var none T
	if !validID(id) {
		return none, status.Errorf(codes.NotFound, "%s %q not found", strings.ToLower(kind), id)
	}
	if err := s.c.Get(ctx, client.ObjectKey{Name: id}, obj); err != nil {
		if apierrors.IsNotFound(err) {
			return none, status.Errorf(codes.NotFound, "%s %q not found", strings.ToLower(kind), id)
		}
		return none, status.Errorf(codes.Unavailable, "get %s %s: %v", kind, id, err)
	}
	return obj, nil
}

func csiVolume(v *v1.Volume, src *csi.VolumeContentSource) *csi.Volume {
	capacity := v.Spec.Size.Value()
	if v.Status.Capacity != nil {
		capacity = v.Status.Capacity.Value()
	}
	out := &csi.Volume{
		VolumeId:      v.Name,
		CapacityBytes: capacity,
		ContentSource: src,
		VolumeContext: map[string]string{ParamMounter: string(v.Spec.Mounter)},
	}
	// A volume in Ceph has no node: every node reaches it. Nor do the pods
	// of a read-write-many filesystem volume need its node: they mount its
	// share over NFS from any node (the share manager's own PV and pod keep
	// to the volume's node).
	if !inCeph(v.Spec.Node) {
		if !v.Spec.ServedOverNFS() {
			out.AccessibleTopology = []*csi.Topology{{Segments: map[string]string{v1.TopologyNodeKey: v.Spec.Node}}}
		}
		out.VolumeContext["node"] = v.Spec.Node
	}
	return out
}

func volumeCondition(v *v1.Volume) *csi.VolumeCondition {
	if v.Status.State == v1.VolumeError {
		return &csi.VolumeCondition{Abnormal: true, Message: v.Status.Message}
	}
	return &csi.VolumeCondition{Message: string(v.Status.State)}
}
