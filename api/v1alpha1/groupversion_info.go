// Package v1alpha1 holds berth's API types, group berth.io, version v1alpha1.
//
// v1alpha1 is every type's storage version (+kubebuilder:storageversion):
// a later version is served beside it and becomes the storage version only
// by a change that says so. Fields are only ever added to a served
// version; docs/operations.md#api-versions-and-version-skew says how a
// version that changes a field's meaning would come in.
//
// +kubebuilder:object:generate=true
// +groupName=berth.io
package v1alpha1

import (
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/scheme"
)

var (
	// GroupVersion is the group and version of every berth resource.
	GroupVersion = schema.GroupVersion{Group: "berth.io", Version: "v1alpha1"}

	// SchemeBuilder registers the berth types with a runtime.Scheme.
	SchemeBuilder = &scheme.Builder{GroupVersion: GroupVersion}

	// AddToScheme adds the berth types to a scheme.
	AddToScheme = SchemeBuilder.AddToScheme
)
