package scheme

import (
	"k8s.io/apimachinery/pkg/api/meta"

	berthv1 "github.com/berth-io/berth/api/v1alpha1"
)

// berthKinds are berth's kinds and whether each is namespaced, as their
// CRDs say (TestMapperMatchesTheCRDs reads the generated CRDs).
var berthKinds = []struct {
	kind       string
	namespaced bool
}{
	{"Attachment", false},
	{"NodeCleanup", false},
	{"ShareManager", true},
	{"Snapshot", false},
	{"StorageCluster", false},
	{"Volume", false},
}

// WithBerthKinds returns a RESTMapper that knows berth's own kinds without
// asking the API server, and asks next (the discovery-backed mapper) for
// every other kind. A component whose caches and controllers are about
// berth's kinds is then built without the API server: the agent heals its
// volumes first, while the API server may still be away (an agent
// restarted during a control-plane outage).
func WithBerthKinds(next meta.RESTMapper) meta.RESTMapper {
	own := meta.NewDefaultRESTMapper(nil)
	for _, k := range berthKinds {
		scope := meta.RESTScopeRoot
		if k.namespaced {
			scope = meta.RESTScopeNamespace
		}
		own.Add(berthv1.GroupVersion.WithKind(k.kind), scope)
	}
	return meta.FirstHitRESTMapper{MultiRESTMapper: meta.MultiRESTMapper{own, next}}
}
