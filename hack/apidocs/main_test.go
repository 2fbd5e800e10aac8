package main

import (
	"bytes"
	"strings"
	"testing"

	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
)

// TestEveryFieldHasARow: the page has a section per kind and a row per
// spec and status field of the repository's CRDs, each row on one line.
func TestEveryFieldHasARow(t *testing.T) {
	crds, err := readCRDs("../../config/crd/bases")
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if err := write(&buf, crds); err != nil {
		t.Fatal(err)
	}
	page := buf.String()
	for _, crd := range crds {
		if !strings.Contains(page, "\n## "+crd.Spec.Names.Kind+"\n") {
			t.Errorf("no section for %s", crd.Spec.Names.Kind)
		}
		s := crd.Spec.Versions[0].Schema.OpenAPIV3Schema
		for _, top := range []string{"spec", "status"} {
			for name := range s.Properties[top].Properties {
				if !strings.Contains(page, "| `"+top+"."+name+"` |") {
					t.Errorf("%s: no row for %s.%s", crd.Spec.Names.Kind, top, name)
				}
			}
		}
	}
	for _, line := range strings.Split(page, "\n") {
		if strings.HasPrefix(line, "| `") && strings.Count(strings.ReplaceAll(line, `\|`, ""), "|") != 4 {
			t.Errorf("row not of three cells: %s", line)
		}
	}
}

// TestCellEscapesPipesAndJoinsLines: a description's newlines and pipes
// cannot break the table.
func TestCellEscapesPipesAndJoinsLines(t *testing.T) {
	got := cell(apiextv1.JSONSchemaProps{Description: "a | b\n  c", Pattern: "^(x|y)$"})
	if want := "a \\| b c (pattern `^(x\\|y)$`)"; got != want {
		t.Errorf("cell = %q, want %q", got, want)
	}
}
