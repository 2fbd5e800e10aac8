package sharemanager

import (
	"context"
	"fmt"

	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/berth-io/berth/api/v1alpha1"
)

// States lists every share state, for a series each (berth_shares).
var States = []string{string(v1.ShareStarting), string(v1.ShareRunning), string(v1.ShareStopping),
	string(v1.ShareStopped), string(v1.ShareError), string(v1.ShareUnknown)}

// StateCounts counts the ShareManagers by state from the manager's cache
// (metrics.ShareSource); it never calls the API server.
type StateCounts struct {
	Reader    client.Reader
	Namespace string
}

// ShareStates implements metrics.ShareSource. A ShareManager without a
// state yet counts as unknown, its CRD default.
func (s StateCounts) ShareStates(ctx context.Context) (map[string]int, error) {
	var list v1.ShareManagerList
	if err := s.Reader.List(ctx, &list, client.InNamespace(s.Namespace)); err != nil {
		return nil, fmt.Errorf("list share managers: %w", err)
	}
	out := map[string]int{}
	for i := range list.Items {
		st := string(list.Items[i].Status.State)
		if st == "" {
			st = string(v1.ShareUnknown)
		}
		out[st]++
	}
	return out, nil
}
