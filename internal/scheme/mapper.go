package scheme

import (
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime/schema"

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
// restarted during a control-plane outage). Only for components that do
// not tell "kind not installed" from a discovery failure by NoMatch errors:
// with the API server away, another kind's lookup fails with an aggregate
// error that meta.IsNoMatchError takes for one.
func WithBerthKinds(next meta.RESTMapper) meta.RESTMapper {
	// Its default version answers a lookup that names none.
	own := meta.NewDefaultRESTMapper([]schema.GroupVersion{berthv1.GroupVersion})
	for _, k := range berthKinds {
		scope := meta.RESTScopeRoot
		if k.namespaced {
			scope = meta.RESTScopeNamespace
		}
		own.Add(berthv1.GroupVersion.WithKind(k.kind), scope)
	}
	return meta.FirstHitRESTMapper{MultiRESTMapper: meta.MultiRESTMapper{own, next}}
}
