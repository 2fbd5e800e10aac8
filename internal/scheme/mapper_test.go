package scheme

import (
	"os"
	"path/filepath"
	"testing"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"sigs.k8s.io/yaml"

	berthv1 "github.com/berth-io/berth/api/v1alpha1"
)

// TestMapperMatchesTheCRDs: every generated CRD's kind is mapped, with the
// CRD's plural and scope, and no other berth kind is.
func TestMapperMatchesTheCRDs(t *testing.T) {
	files, err := filepath.Glob("../../deploy/berth/crds/*.yaml")
	if err != nil || len(files) == 0 {
		t.Fatalf("no CRDs found: %v", err)
	}
	m := WithBerthKinds(meta.NewDefaultRESTMapper(nil))
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var crd apiextensionsv1.CustomResourceDefinition
		if err := yaml.Unmarshal(b, &crd); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		gk := berthv1.GroupVersion.WithKind(crd.Spec.Names.Kind).GroupKind()
		mapping, err := m.RESTMapping(gk) // no version: the mapper's default
		if err != nil {
			t.Errorf("%s: kind %s not mapped: %v", f, gk.Kind, err)
			continue
		}
		wantScope := meta.RESTScopeNameRoot
		if crd.Spec.Scope == apiextensionsv1.NamespaceScoped {
			wantScope = meta.RESTScopeNameNamespace
		}
		if mapping.Resource.Resource != crd.Spec.Names.Plural || mapping.Scope.Name() != wantScope {
			t.Errorf("kind %s: mapped to %s, %s; its CRD says %s, %s", gk.Kind, mapping.Resource.Resource, mapping.Scope.Name(), crd.Spec.Names.Plural, wantScope)
		}
	}
	if len(berthKinds) != len(files) {
		t.Errorf("%d kinds mapped, %d CRDs", len(berthKinds), len(files))
	}
}

// TestMapperAsksNextForOtherKinds: a kind that is not berth's goes to the
// next mapper.
func TestMapperAsksNextForOtherKinds(t *testing.T) {
	next := meta.NewDefaultRESTMapper(nil)
	pods := berthv1.GroupVersion.WithKind("Pod")
	pods.Group, pods.Version = "", "v1"
	next.Add(pods, meta.RESTScopeNamespace)
	mapping, err := WithBerthKinds(next).RESTMapping(pods.GroupKind(), "v1")
	if err != nil || mapping.Resource.Resource != "pods" {
		t.Errorf("pods: %+v, %v", mapping, err)
	}
}
