package delaybridge_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// designTable reads the package table of docs/design.md: each package of
// the module and the packages of the module it may import, taken from the
// backquoted names of its last column ("the root" is the root package).
// A nil list ("everything") allows any. Imports point down the table, so
// a newcomer finds each piece where the table says and no cycle can
// start; a package missing from it fails the test until it has a row.
func designTable(t *testing.T) map[string][]string {
	t.Helper()
	b, err := os.ReadFile("docs/design.md")
	if err != nil {
		t.Fatal(err)
	}
	_, table, ok := strings.Cut(string(b), "| package | what it owns | imports |\n|---|---|---|\n")
	if !ok {
		t.Fatal("docs/design.md has no package table")
	}
	quoted := regexp.MustCompile("`([^`]+)`")
	type row struct{ pkgs, imports []string }
	var rows []row
	for _, line := range strings.Split(table, "\n") {
		if !strings.HasPrefix(line, "|") {
			break
		}
		cells := strings.Split(strings.Trim(line, "| "), " | ")
		if len(cells) != 3 {
			t.Fatalf("docs/design.md: a package row with %d cells: %s", len(cells), line)
		}
		var r row
		for _, m := range quoted.FindAllStringSubmatch(cells[0], -1) {
			if m[1] == "delaybridge" {
				m[1] = "."
			}
			r.pkgs = append(r.pkgs, m[1])
		}
		if !strings.Contains(cells[2], "everything") {
			r.imports = []string{}
			if strings.Contains(cells[2], "the root") {
				r.imports = append(r.imports, ".")
			}
			for _, m := range quoted.FindAllStringSubmatch(cells[2], -1) {
				r.imports = append(r.imports, m[1])
			}
		}
		rows = append(rows, r)
	}
	layers := map[string][]string{}
	for _, r := range rows {
		for _, p := range r.pkgs {
			layers[p] = r.imports
		}
	}
	// Only the module's packages count; a name such as `Adapter` in the
	// last column is not one.
	for p, imports := range layers {
		if imports != nil {
			layers[p] = slices.DeleteFunc(imports, func(i string) bool { _, pkg := layers[i]; return !pkg })
		}
	}
	return layers
}

func TestPackages_ImportOnlyDownTheDesignTable(t *testing.T) {
	t.Parallel()
	const module = "github.com/delaybridge/delaybridge"
	layers := designTable(t)
	found := map[string]bool{}
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if name := d.Name(); path != "." && (strings.HasPrefix(name, ".") || name == "testdata" || name == "node_modules" || name == "bin") {
				return filepath.SkipDir
			}
			// A folder with a go.mod of its own (scripts/otelcol, the test
			// collector) is another module, none of this one's packages.
			if _, err := os.Stat(filepath.Join(path, "go.mod")); path != "." && err == nil {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		pkg := filepath.ToSlash(filepath.Dir(path))
		f, err := parser.ParseFile(token.NewFileSet(), path, nil, parser.ImportsOnly)
		if err != nil {
			return err
		}
		allowed, known := layers[pkg]
		if !known {
			t.Errorf("%s: package %s has no row in the package table of docs/design.md", path, pkg)
			return nil
		}
		found[pkg] = true
		for _, imp := range f.Imports {
			p, err := strconv.Unquote(imp.Path.Value)
			if err != nil {
				return err
			}
			var dep string
			switch {
			case p == module:
				dep = "."
			case strings.HasPrefix(p, module+"/"):
				dep = strings.TrimPrefix(p, module+"/")
			default:
				continue
			}
			if allowed != nil && !slices.Contains(allowed, dep) {
				t.Errorf("%s imports %s; the package table of docs/design.md lets %s import only %v", path, dep, pkg, allowed)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, pkg := range slices.Sorted(maps.Keys(layers)) {
		if !found[pkg] {
			t.Errorf("the table names %s, but no Go file of it was found: the walk proves nothing, or the row is stale", pkg)
		}
	}
}

// The root package links no broker client: a program on RabbitMQ builds
// without the RocketMQ client and the other way round. Its adapter comes
// as a value (Config.Broker) or from the registry the adapters fill.
func TestRoot_LinksNoBrokerClient(t *testing.T) {
	t.Parallel()
	out, err := exec.Command("go", "list", "-deps", ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go list -deps .: %v\n%s", err, out)
	}
	for _, dep := range strings.Fields(string(out)) {
		for _, client := range []string{"github.com/rabbitmq/amqp091-go", "github.com/apache/rocketmq-client-go", "github.com/delaybridge/delaybridge/internal/rabbit", "github.com/delaybridge/delaybridge/internal/rocket"} {
			if dep == client || strings.HasPrefix(dep, client+"/") {
				t.Errorf("the root package depends on %s", dep)
			}
		}
	}
}

// The public packages stay small: what users do not call is internal. The
// bound is issue 44's; raise it only with a name users need.
func TestPublicSurface_AtMost90Names(t *testing.T) {
	t.Parallel()
	total := 0
	for _, dir := range []string{".", "broker", "broker/brokertest", "broker/memory", "outbox", "rabbit", "rocket", "scanner"} {
		entries, err := os.ReadDir(dir)
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, e := range entries {
			name := e.Name()
			if e.IsDir() || !strings.HasSuffix(name, ".go") || strings.HasSuffix(name, "_test.go") {
				continue
			}
			f, err := parser.ParseFile(token.NewFileSet(), filepath.Join(dir, name), nil, 0)
			if err != nil {
				t.Fatal(err)
			}
			for _, d := range f.Decls {
				switch d := d.(type) {
				case *ast.FuncDecl:
					if d.Recv == nil && d.Name.IsExported() {
						n++
					}
				case *ast.GenDecl:
					for _, s := range d.Specs {
						switch s := s.(type) {
						case *ast.TypeSpec:
							if s.Name.IsExported() {
								n++
							}
						case *ast.ValueSpec:
							for _, id := range s.Names {
								if id.IsExported() {
									n++
								}
							}
						}
					}
				}
			}
		}
		if n == 0 {
			t.Errorf("%s: no exported names found; the count proves nothing", dir)
		}
		total += n
	}
	if total > 90 {
		t.Errorf("the public packages export %d top-level names, more than 90", total)
	}
}
