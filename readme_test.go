package delaybridge_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"strings"
	"testing"
)

// readmeFuncs are the functions of example_test.go the README shows, in
// order: its code is taken from a compiled, tested example.
var readmeFuncs = []string{"Example", "openOrders", "inTx"}

// readmeMarker precedes the README's copy of them.
const readmeMarker = "<!-- example_test.go: Example, openOrders, inTx; readme_test.go keeps them equal -->"

func TestREADME_CodeIsTheCompiledExample(t *testing.T) {
	t.Parallel()
	src, err := os.ReadFile("example_test.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, "example_test.go", src, parser.ParseComments)
	if err != nil {
		t.Fatal(err)
	}
	decls := map[string]*ast.FuncDecl{}
	for _, d := range f.Decls {
		if fd, ok := d.(*ast.FuncDecl); ok {
			decls[fd.Name.Name] = fd
		}
	}
	var want []string
	for _, name := range readmeFuncs {
		fd := decls[name]
		if fd == nil {
			t.Fatalf("example_test.go has no func %s", name)
		}
		start := fd.Pos()
		if fd.Doc != nil {
			start = fd.Doc.Pos()
		}
		want = append(want, string(src[fset.Position(start).Offset:fset.Position(fd.End()).Offset]))
	}
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, after, ok := strings.Cut(string(readme), readmeMarker+"\n```go\n")
	if !ok {
		t.Fatalf("README.md lacks %q followed by a go block", readmeMarker)
	}
	got, _, ok := strings.Cut(after, "\n```\n")
	if !ok {
		t.Fatal("README.md: the example's go block does not end")
	}
	if w := strings.Join(want, "\n\n"); got != w {
		t.Errorf("README.md's example differs from example_test.go's %v; copy them again.\nREADME:\n%s\nexample_test.go:\n%s", readmeFuncs, got, w)
	}
}
