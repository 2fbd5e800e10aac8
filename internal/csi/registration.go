package csi

import (
	"context"

	"github.com/go-logr/logr"
	"google.golang.org/grpc"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
)

// Registration answers kubelet's plugin watcher, which finds the socket in
// <kubelet root>/plugins_registry and learns the CSI endpoint from it. berth
// serves this itself, so no node-driver-registrar sidecar is needed.
type Registration struct {
	registerapi.UnimplementedRegistrationServer
	driver, endpoint string
	log              logr.Logger
	registered       chan struct{}
}

// NewRegistration returns the registration service for driver, whose CSI
// socket kubelet should dial at endpoint (a path on the node).
func NewRegistration(driver, endpoint string, log logr.Logger) *Registration {
	return &Registration{driver: driver, endpoint: endpoint, log: log, registered: make(chan struct{})}
}

// GetInfo implements the kubelet registration API.
func (r *Registration) GetInfo(context.Context, *registerapi.InfoRequest) (*registerapi.PluginInfo, error) {
	return &registerapi.PluginInfo{
		Type:              registerapi.CSIPlugin,
		Name:              r.driver,
		Endpoint:          r.endpoint,
		SupportedVersions: []string{"1.0.0"},
	}, nil
}

// NotifyRegistrationStatus implements the kubelet registration API.
func (r *Registration) NotifyRegistrationStatus(_ context.Context, s *registerapi.RegistrationStatus) (*registerapi.RegistrationStatusResponse, error) {
	if !s.PluginRegistered {
		r.log.Info("kubelet refused the plugin registration", "error", s.Error)
		return &registerapi.RegistrationStatusResponse{}, nil
	}
	r.log.Info("registered with kubelet")
	select {
	case <-r.registered:
	default:
		close(r.registered)
	}
	return &registerapi.RegistrationStatusResponse{}, nil
}

// Registered is closed once kubelet confirmed the registration.
func (r *Registration) Registered() <-chan struct{} { return r.registered }

// NewRegistrationServer returns a gRPC server with the registration service.
func NewRegistrationServer(r *Registration) *grpc.Server {
	srv := grpc.NewServer()
	registerapi.RegisterRegistrationServer(srv, r)
	return srv
}
