package csi

import (
	"context"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// Identity is the CSI Identity service of both the controller and the agent.
type Identity struct {
	csi.UnimplementedIdentityServer
	name, version string
	controller    bool
	ready         func(context.Context) error
}

// NewIdentity returns the Identity service. controller says whether the
// endpoint also serves the Controller service; ready reports readiness
// (nil: always ready).
func NewIdentity(name, version string, controller bool, ready func(context.Context) error) *Identity {
	return &Identity{name: name, version: version, controller: controller, ready: ready}
}

// GetPluginInfo implements csi.IdentityServer.
func (i *Identity) GetPluginInfo(context.Context, *csi.GetPluginInfoRequest) (*csi.GetPluginInfoResponse, error) {
	return &csi.GetPluginInfoResponse{Name: i.name, VendorVersion: i.version}, nil
}

// GetPluginCapabilities implements csi.IdentityServer.
func (i *Identity) GetPluginCapabilities(context.Context, *csi.GetPluginCapabilitiesRequest) (*csi.GetPluginCapabilitiesResponse, error) {
	svc := func(t csi.PluginCapability_Service_Type) *csi.PluginCapability {
		return &csi.PluginCapability{Type: &csi.PluginCapability_Service_{Service: &csi.PluginCapability_Service{Type: t}}}
	}
	caps := []*csi.PluginCapability{
		svc(csi.PluginCapability_Service_VOLUME_ACCESSIBILITY_CONSTRAINTS),
		{Type: &csi.PluginCapability_VolumeExpansion_{VolumeExpansion: &csi.PluginCapability_VolumeExpansion{Type: csi.PluginCapability_VolumeExpansion_ONLINE}}},
	}
	if i.controller {
		caps = append(caps, svc(csi.PluginCapability_Service_CONTROLLER_SERVICE))
	}
	return &csi.GetPluginCapabilitiesResponse{Capabilities: caps}, nil
}

// Probe implements csi.IdentityServer.
func (i *Identity) Probe(ctx context.Context, _ *csi.ProbeRequest) (*csi.ProbeResponse, error) {
	if i.ready != nil {
		if err := i.ready(ctx); err != nil {
			return nil, status.Errorf(codes.FailedPrecondition, "not ready: %v", err)
		}
	}
	return &csi.ProbeResponse{Ready: wrapperspb.Bool(true)}, nil
}
