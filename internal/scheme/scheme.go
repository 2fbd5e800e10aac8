// Package scheme builds the runtime.Scheme every berth component uses: the
// Kubernetes built-in types and berth's own.
package scheme

import (
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"

	berthv1 "github.com/berth-io/berth/api/v1alpha1"
)

// New returns a scheme with the Kubernetes and berth types.
func New() (*runtime.Scheme, error) {
	s := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(s); err != nil {
		return nil, err
	}
	if err := berthv1.AddToScheme(s); err != nil {
		return nil, err
	}
	return s, nil
}
