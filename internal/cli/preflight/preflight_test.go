package preflight

import (
	"context"
	"errors"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	v1 "github.com/berth-io/berth/api/v1alpha1"
	"github.com/berth-io/berth/internal/scheme"
)

// The checks run on a real API server in internal/preflight; this is the
// command's output and exit on a fake reader.
func TestPreflightOutput(t *testing.T) {
	s, err := scheme.New()
	if err != nil {
		t.Fatal(err)
	}
	ready := &v1.StorageCluster{ObjectMeta: metav1.ObjectMeta{Name: "a"}, Status: v1.StorageClusterStatus{Phase: v1.StorageClusterReady}}
	var out strings.Builder
	cfg := Config{Namespace: "berth-system", Out: &out,
		Reader: fake.NewClientBuilder().WithScheme(s).WithObjects(ready).WithStatusSubresource(ready).Build()}
	if err := cfg.Run(context.Background()); err != nil || !strings.HasPrefix(out.String(), "ready to upgrade: 1 storage clusters ready") {
		t.Fatalf("quiet: %v, %q", err, out.String())
	}
	broken := &v1.Volume{ObjectMeta: metav1.ObjectMeta{Name: "v"}, Status: v1.VolumeStatus{State: v1.VolumeError, Message: "gone"}}
	out.Reset()
	cfg.Reader = fake.NewClientBuilder().WithScheme(s).WithObjects(ready, broken).Build()
	err = cfg.Run(context.Background())
	if !errors.Is(err, ErrNotReady) || !strings.Contains(out.String(), "Volume v: in Error: gone") {
		t.Fatalf("a volume in error: %v, %q", err, out.String())
	}
}
