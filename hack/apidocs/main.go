// Command apidocs writes docs/api.md, the API reference, from the CRDs
// that controller-gen generates from the types (config/crd/bases): every
// kind's columns and every field with its type, rules and doc comment.
// `make generate` runs it, so `make verify` proves the page current.
//
//	go run ./hack/apidocs -crds config/crd/bases -out docs/api.md
package main

import (
	"bytes"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"

	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"sigs.k8s.io/yaml"
)

// kindOrder puts the kinds an operator meets first at the top; others
// follow by name.
var kindOrder = []string{"StorageCluster", "Volume", "Attachment", "Snapshot", "ShareManager", "NodeCleanup"}

func main() {
	crds := flag.String("crds", "config/crd/bases", "folder of the CRD manifests")
	out := flag.String("out", "docs/api.md", "page to write")
	flag.Parse()
	if err := run(*crds, *out); err != nil {
		fmt.Fprintln(os.Stderr, "apidocs:", err)
		os.Exit(1)
	}
}

func run(dir, out string) error {
	crds, err := readCRDs(dir)
	if err != nil {
		return err
	}
	var buf bytes.Buffer
	if err := write(&buf, crds); err != nil {
		return err
	}
	return os.WriteFile(out, buf.Bytes(), 0o644)
}

// readCRDs reads every CRD manifest of dir; none is an error.
func readCRDs(dir string) ([]apiextv1.CustomResourceDefinition, error) {
	files, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	if err != nil {
		return nil, err
	}
	var crds []apiextv1.CustomResourceDefinition
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return nil, err
		}
		var crd apiextv1.CustomResourceDefinition
		if err := yaml.UnmarshalStrict(b, &crd); err != nil {
			return nil, fmt.Errorf("%s: %w", f, err)
		}
		crds = append(crds, crd)
	}
	if len(crds) == 0 {
		return nil, fmt.Errorf("no CRD in %s", dir)
	}
	return crds, nil
}

// write renders the page.
func write(w io.Writer, crds []apiextv1.CustomResourceDefinition) error {
	rank := func(kind string) int {
		if i := slices.Index(kindOrder, kind); i >= 0 {
			return i
		}
		return len(kindOrder)
	}
	slices.SortFunc(crds, func(a, b apiextv1.CustomResourceDefinition) int {
		if d := rank(a.Spec.Names.Kind) - rank(b.Spec.Names.Kind); d != 0 {
			return d
		}
		return strings.Compare(a.Spec.Names.Kind, b.Spec.Names.Kind)
	})
	p := func(format string, a ...any) { fmt.Fprintf(w, format, a...) }
	p("# API reference\n\n")
	p("Generated from the CRDs (`config/crd/bases`, made from the Go types in\n")
	p("`api/v1alpha1` by controller-gen) by `hack/apidocs`; `make generate`\n")
	p("writes it. The field descriptions are the types' doc comments.\n\n")
	for _, crd := range crds {
		p("- [%s](#%s)\n", crd.Spec.Names.Kind, strings.ToLower(crd.Spec.Names.Kind))
	}
	for _, crd := range crds {
		if err := writeKind(w, crd); err != nil {
			return fmt.Errorf("%s: %w", crd.Name, err)
		}
	}
	return nil
}

func writeKind(w io.Writer, crd apiextv1.CustomResourceDefinition) error {
	p := func(format string, a ...any) { fmt.Fprintf(w, format, a...) }
	n := crd.Spec.Names
	p("\n## %s\n\n", n.Kind)
	for _, v := range crd.Spec.Versions {
		if v.Schema == nil || v.Schema.OpenAPIV3Schema == nil {
			return fmt.Errorf("version %s has no schema", v.Name)
		}
		s := v.Schema.OpenAPIV3Schema
		facts := []string{"`" + crd.Spec.Group + "/" + v.Name + "`", strings.ToLower(string(crd.Spec.Scope))}
		if v.Storage {
			facts = append(facts, "stored")
		}
		if len(n.ShortNames) > 0 {
			facts = append(facts, "short name `"+strings.Join(n.ShortNames, "`, `")+"`")
		}
		p("%s. %s\n", strings.Join(facts, ", "), oneLine(s.Description))
		if len(v.AdditionalPrinterColumns) > 0 {
			p("\n`kubectl get %s` columns:", n.Plural)
			for _, c := range v.AdditionalPrinterColumns {
				col := c.Name
				if c.Priority > 0 {
					col += " (-o wide)"
				}
				p(" %s `%s`;", col, c.JSONPath)
			}
			p("\n")
		}
		for _, top := range []string{"spec", "status"} {
			prop, ok := s.Properties[top]
			if !ok {
				continue
			}
			p("\n### %s %s\n\n", n.Kind, top)
			if d := oneLine(prop.Description); d != "" {
				p("%s\n\n", d)
			}
			p("| field | type | description |\n| --- | --- | --- |\n")
			fields(w, top, prop)
		}
	}
	return nil
}

// fields writes one row per field below s, depth first, fields in name
// order; path is s's own.
func fields(w io.Writer, path string, s apiextv1.JSONSchemaProps) {
	if s.Type == "array" && s.Items != nil && s.Items.Schema != nil {
		fields(w, path+"[]", *s.Items.Schema)
		return
	}
	names := make([]string, 0, len(s.Properties))
	for name := range s.Properties {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		prop := s.Properties[name]
		fp := path + "." + name
		req := ""
		if slices.Contains(s.Required, name) {
			req = ", required"
		}
		fmt.Fprintf(w, "| `%s` | %s%s | %s |\n", fp, typeOf(prop), req, cell(prop))
		fields(w, fp, prop)
	}
	if s.AdditionalProperties != nil && s.AdditionalProperties.Schema != nil {
		fields(w, path+".*", *s.AdditionalProperties.Schema)
	}
}

// typeOf names a field's type: arrays and maps by their items.
func typeOf(s apiextv1.JSONSchemaProps) string {
	switch {
	case s.Type == "array" && s.Items != nil && s.Items.Schema != nil:
		return "[]" + typeOf(*s.Items.Schema)
	case s.Type == "object" && s.AdditionalProperties != nil && s.AdditionalProperties.Schema != nil:
		return "map[string]" + typeOf(*s.AdditionalProperties.Schema)
	case s.XIntOrString:
		return "int or string"
	case s.Format != "":
		return s.Type + " (" + s.Format + ")"
	case s.Type == "":
		return "any"
	}
	return s.Type
}

// cell is a field's description with its rules after it.
func cell(s apiextv1.JSONSchemaProps) string {
	var rules []string
	if s.Default != nil {
		rules = append(rules, "default `"+string(s.Default.Raw)+"`")
	}
	if len(s.Enum) > 0 {
		var vals []string
		for _, e := range s.Enum {
			vals = append(vals, "`"+string(e.Raw)+"`")
		}
		rules = append(rules, "one of "+strings.Join(vals, ", "))
	}
	if s.Minimum != nil {
		rules = append(rules, fmt.Sprintf("minimum %g", *s.Minimum))
	}
	if s.Maximum != nil {
		rules = append(rules, fmt.Sprintf("maximum %g", *s.Maximum))
	}
	if s.MaxLength != nil {
		rules = append(rules, fmt.Sprintf("at most %d characters", *s.MaxLength))
	}
	if s.MaxItems != nil {
		rules = append(rules, fmt.Sprintf("at most %d items", *s.MaxItems))
	}
	if s.Pattern != "" {
		rules = append(rules, "pattern `"+s.Pattern+"`")
	}
	for _, v := range s.XValidations {
		rule := v.Message
		if rule == "" {
			rule = "`" + v.Rule + "`"
		}
		rules = append(rules, "rule: "+rule)
	}
	d := oneLine(s.Description)
	if len(rules) > 0 {
		if d != "" {
			d += " "
		}
		d += "(" + strings.Join(rules, "; ") + ")"
	}
	return strings.ReplaceAll(d, "|", `\|`)
}

// oneLine joins a doc comment's lines: a table cell holds one line.
func oneLine(s string) string {
	return strings.Join(strings.Fields(s), " ")
}
