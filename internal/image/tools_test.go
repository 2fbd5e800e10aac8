package image

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// hostSide are the packages under internal/ that run on a developer's or
// CI machine, never in the berth image: what they exec is not its business.
var hostSide = []string{"image", "testenv", "cli/dev"}

// TestBerthToolsCoverWhatBerthExecs: every program that berth's code runs
// by name (exec.Command / CommandContext with a literal) is a required tool
// of the image, so that the image cannot lack it. (A stage that grew an
// ext4 volume ran dumpe2fs, absent from the image: every restore failed.)
func TestBerthToolsCoverWhatBerthExecs(t *testing.T) {
	required, _ := BerthTools()
	root := ".."
	fset := token.NewFileSet()
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		if d.IsDir() {
			if slices.Contains(hostSide, filepath.ToSlash(rel)) {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(p, ".go") || strings.HasSuffix(p, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, p, nil, 0)
		if err != nil {
			return err
		}
		ast.Inspect(f, func(n ast.Node) bool {
			call, ok := n.(*ast.CallExpr)
			if !ok {
				return true
			}
			sel, ok := call.Fun.(*ast.SelectorExpr)
			if !ok || (sel.Sel.Name != "Command" && sel.Sel.Name != "CommandContext") {
				return true
			}
			// The program: Command(name, ...), CommandContext(ctx, name, ...).
			i := 0
			if sel.Sel.Name == "CommandContext" {
				i = 1
			}
			if len(call.Args) <= i {
				return true
			}
			lit, ok := call.Args[i].(*ast.BasicLit)
			if !ok || lit.Kind != token.STRING {
				return true // a path computed at run time, e.g. the installed Flexvolume driver
			}
			prog, _ := strconv.Unquote(lit.Value)
			if !slices.Contains(required, prog) {
				t.Errorf("%s runs %q, which is not a required tool of the berth image (BerthTools)", fset.Position(lit.Pos()), prog)
			}
			return true
		})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
