package sharemanager

import (
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	v1 "github.com/berth-io/berth/api/v1alpha1"
	"github.com/berth-io/berth/internal/scheme"
)

// StateCounts counts the namespace's ShareManagers by state; one with no
// state yet counts as unknown, one of another namespace not at all.
func TestStateCounts(t *testing.T) {
	s, err := scheme.New()
	if err != nil {
		t.Fatal(err)
	}
	sm := func(ns, name string, st v1.ShareState) client.Object {
		return &v1.ShareManager{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Status: v1.ShareManagerStatus{State: st}}
	}
	c := fake.NewClientBuilder().WithScheme(s).WithObjects(
		sm("berth-system", "a", v1.ShareRunning), sm("berth-system", "b", v1.ShareRunning),
		sm("berth-system", "c", v1.ShareError), sm("berth-system", "d", ""), sm("other", "e", v1.ShareError),
	).Build()
	got, err := StateCounts{Reader: c, Namespace: "berth-system"}.ShareStates(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]int{"running": 2, "error": 1, "unknown": 1}
	if len(got) != len(want) {
		t.Fatalf("states %v, want %v", got, want)
	}
	for st, n := range want {
		if got[st] != n {
			t.Errorf("state %s: %d, want %d (all: %v)", st, got[st], n, got)
		}
	}
}
