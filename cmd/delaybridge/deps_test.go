package main

import (
	"go/parser"
	"go/token"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// The binary depends on no example: an example is code to read and copy,
// never a library. The demo's order service lives in internal/orders;
// examples/ordertimeout carries its own, on the public API only.
func TestBinary_ImportsNoExample(t *testing.T) {
	t.Parallel()
	const module = "github.com/delaybridge/delaybridge"
	root := filepath.Join("..", "..")
	seen := map[string]bool{}
	queue := []string{module + "/cmd/delaybridge"}
	for len(queue) > 0 {
		pkg := queue[0]
		queue = queue[1:]
		if seen[pkg] {
			continue
		}
		seen[pkg] = true
		if strings.HasPrefix(pkg, module+"/examples") {
			t.Errorf("cmd/delaybridge depends on %s", pkg)
		}
		files, err := filepath.Glob(filepath.Join(root, strings.TrimPrefix(pkg, module), "*.go"))
		if err != nil || len(files) == 0 {
			t.Fatalf("no Go files for %s: %v", pkg, err)
		}
		for _, name := range files {
			if strings.HasSuffix(name, "_test.go") {
				continue
			}
			f, err := parser.ParseFile(token.NewFileSet(), name, nil, parser.ImportsOnly)
			if err != nil {
				t.Fatal(err)
			}
			for _, imp := range f.Imports {
				path, err := strconv.Unquote(imp.Path.Value)
				if err != nil {
					t.Fatal(err)
				}
				if path == module || strings.HasPrefix(path, module+"/") {
					queue = append(queue, path)
				}
			}
		}
	}
	for _, want := range []string{module + "/internal/outbox", module + "/internal/orders"} {
		if !seen[want] {
			t.Errorf("the walk never reached %s: it proves nothing", want)
		}
	}
}
