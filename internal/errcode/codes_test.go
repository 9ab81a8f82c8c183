package errcode

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
)

const repoRoot = "../.."

// declaredCodes reads codes.go: every constant of type Code, which must carry a doc comment.
func declaredCodes(t *testing.T) map[string]string {
	t.Helper()
	f, err := parser.ParseFile(token.NewFileSet(), "codes.go", nil, parser.ParseComments)
	if err != nil {
		t.Fatal(err)
	}
	codes := map[string]string{} // value → constant name
	for _, d := range f.Decls {
		g, ok := d.(*ast.GenDecl)
		if !ok || g.Tok != token.CONST {
			continue
		}
		for _, s := range g.Specs {
			vs := s.(*ast.ValueSpec)
			if id, ok := vs.Type.(*ast.Ident); !ok || id.Name != "Code" {
				continue
			}
			for i, n := range vs.Names {
				lit, ok := vs.Values[i].(*ast.BasicLit)
				if !ok || lit.Kind != token.STRING {
					t.Fatalf("%s: declare codes as string literals", n.Name)
				}
				v, _ := strconv.Unquote(lit.Value)
				if prev, dup := codes[v]; dup {
					t.Errorf("%s and %s both declare %q", prev, n.Name, v)
				}
				codes[v] = n.Name
				if vs.Doc == nil || !strings.HasPrefix(vs.Doc.Text(), n.Name+" ") {
					t.Errorf("%s has no doc comment starting with its name", n.Name)
				}
			}
		}
	}
	if len(codes) == 0 {
		t.Fatal("no codes found in codes.go")
	}
	return codes
}

// TestCodesDocumented requires docs/errors.md to list exactly the declared codes.
func TestCodesDocumented(t *testing.T) {
	codes := declaredCodes(t)
	doc, err := os.ReadFile(filepath.Join(repoRoot, "docs", "errors.md"))
	if err != nil {
		t.Fatal(err)
	}
	documented := map[string]bool{}
	cell := regexp.MustCompile("`([a-z0-9_]+)`")
	for _, line := range strings.Split(string(doc), "\n") {
		if !strings.HasPrefix(line, "| `") {
			continue
		}
		first := strings.SplitN(line[1:], "|", 2)[0]
		for _, m := range cell.FindAllStringSubmatch(first, -1) {
			documented[m[1]] = true
		}
	}
	for v, name := range codes {
		if !documented[v] {
			t.Errorf("%s (%q) is not in docs/errors.md", name, v)
		}
	}
	for v := range documented {
		if _, ok := codes[v]; !ok {
			t.Errorf("docs/errors.md lists %q, which codes.go does not declare", v)
		}
	}
}

// TestNoLiteralCodes scans the repository's Go files: a code is always named by its constant.
// A string literal where a Code is expected would compile (an untyped constant), so this test is
// what catches a typo or an undeclared code. It checks the code argument of New, Wrap, Is and
// Code(...), comparisons with Of(...), the Code field of Error literals, and composite literals
// (test tables) whose field, element, key or value type is errcode.Code.
func TestNoLiteralCodes(t *testing.T) {
	const importPath = "github.com/pgrelay/pgrelay/internal/errcode"
	var found []string
	err := filepath.WalkDir(repoRoot, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if n := d.Name(); path != repoRoot && (strings.HasPrefix(n, ".") || n == "testdata" || n == "vendor" || n == "node_modules") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") {
			return nil
		}
		fset := token.NewFileSet()
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		inPkg := filepath.Clean(filepath.Dir(path)) == filepath.Clean(filepath.Join(repoRoot, "internal", "errcode"))
		if inPkg && filepath.Base(path) == "codes.go" {
			return nil
		}
		local := "" // the name errcode is imported as; "" when the file is in package errcode
		if !inPkg {
			for _, imp := range f.Imports {
				if p, _ := strconv.Unquote(imp.Path.Value); p == importPath {
					local = "errcode"
					if imp.Name != nil {
						local = imp.Name.Name
					}
				}
			}
			if local == "" {
				return nil
			}
		}
		for _, s := range literalCodes(f, local) {
			found = append(found, fset.Position(s.Pos()).String()+": "+s.Value)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range found {
		t.Errorf("%s: a string literal as an error code; use the errcode constant (declare it in internal/errcode/codes.go and document it in docs/errors.md)", s)
	}
}

// literalCodes returns the string literals f uses as codes; pkg is how f names package errcode
// ("" inside it).
func literalCodes(f *ast.File, pkg string) []*ast.BasicLit {
	var out []*ast.BasicLit
	flag := func(e ast.Expr) {
		for {
			p, ok := e.(*ast.ParenExpr)
			if !ok {
				break
			}
			e = p.X
		}
		if lit, ok := e.(*ast.BasicLit); ok && lit.Kind == token.STRING && lit.Value != `""` && lit.Value != "``" {
			out = append(out, lit)
		}
	}
	// is reports whether e names the package's identifier name (errcode.Name, or Name inside it).
	is := func(e ast.Expr, names ...string) bool {
		switch x := e.(type) {
		case *ast.SelectorExpr:
			id, ok := x.X.(*ast.Ident)
			return ok && pkg != "" && id.Name == pkg && slices.Contains(names, x.Sel.Name)
		case *ast.Ident:
			return pkg == "" && slices.Contains(names, x.Name)
		}
		return false
	}
	isCode := func(e ast.Expr) bool { return e != nil && is(e, "Code") }
	types := map[string]ast.Expr{} // the file's type declarations, for named table types
	ast.Inspect(f, func(n ast.Node) bool {
		if ts, ok := n.(*ast.TypeSpec); ok {
			types[ts.Name.Name] = ts.Type
		}
		return true
	})
	resolve := func(e ast.Expr) ast.Expr {
		for i := 0; i < 4; i++ {
			if p, ok := e.(*ast.StarExpr); ok {
				e = p.X
			}
			id, ok := e.(*ast.Ident)
			if !ok || types[id.Name] == nil {
				break
			}
			e = types[id.Name]
		}
		return e
	}
	seen := map[*ast.CompositeLit]bool{}
	var lit func(cl *ast.CompositeLit, typ ast.Expr)
	lit = func(cl *ast.CompositeLit, typ ast.Expr) {
		if seen[cl] {
			return
		}
		seen[cl] = true
		if cl.Type != nil {
			typ = cl.Type
		}
		typ = resolve(typ)
		elem := func(e ast.Expr, et ast.Expr) {
			if c, ok := e.(*ast.CompositeLit); ok {
				lit(c, et)
			} else if u, ok := e.(*ast.UnaryExpr); ok && u.Op == token.AND {
				if c, ok := u.X.(*ast.CompositeLit); ok {
					lit(c, et)
				}
			} else if isCode(et) {
				flag(e)
			}
		}
		switch tt := typ.(type) {
		case *ast.ArrayType:
			for _, e := range cl.Elts {
				if kv, ok := e.(*ast.KeyValueExpr); ok {
					e = kv.Value
				}
				elem(e, tt.Elt)
			}
		case *ast.MapType:
			for _, e := range cl.Elts {
				if kv, ok := e.(*ast.KeyValueExpr); ok {
					elem(kv.Key, tt.Key)
					elem(kv.Value, tt.Value)
				}
			}
		case *ast.StructType:
			var fields []ast.Expr
			byName := map[string]ast.Expr{}
			for _, fl := range tt.Fields.List {
				for _, n := range fl.Names {
					fields = append(fields, fl.Type)
					byName[n.Name] = fl.Type
				}
				if len(fl.Names) == 0 {
					fields = append(fields, fl.Type)
				}
			}
			for i, e := range cl.Elts {
				if kv, ok := e.(*ast.KeyValueExpr); ok {
					if id, ok := kv.Key.(*ast.Ident); ok {
						elem(kv.Value, byName[id.Name])
					}
				} else if i < len(fields) {
					elem(e, fields[i])
				}
			}
		default:
			if is(typ, "Error") { // errcode.Error{Code: ...}
				for _, e := range cl.Elts {
					if kv, ok := e.(*ast.KeyValueExpr); ok {
						if id, ok := kv.Key.(*ast.Ident); ok && id.Name == "Code" {
							flag(kv.Value)
						}
					}
				}
			}
		}
	}
	ast.Inspect(f, func(n ast.Node) bool {
		switch x := n.(type) {
		case *ast.CallExpr:
			switch {
			case is(x.Fun, "New", "Wrap", "Code") && len(x.Args) > 0:
				flag(x.Args[0])
			case is(x.Fun, "Is") && len(x.Args) > 1:
				flag(x.Args[1])
			}
		case *ast.BinaryExpr:
			if x.Op == token.EQL || x.Op == token.NEQ {
				if c, ok := x.X.(*ast.CallExpr); ok && is(c.Fun, "Of") {
					flag(x.Y)
				}
				if c, ok := x.Y.(*ast.CallExpr); ok && is(c.Fun, "Of") {
					flag(x.X)
				}
			}
		case *ast.CompositeLit:
			lit(x, nil) // and its nested literals, with their element types
		}
		return true
	})
	return out
}

// TestLiteralCodesFinds proves the scan finds each kind of literal code and leaves constants,
// messages and other strings alone.
func TestLiteralCodesFinds(t *testing.T) {
	const src = `package p

import ec "github.com/pgrelay/pgrelay/internal/errcode"

type step struct {
	name string
	code ec.Code
}

var (
	a = ec.New("fenced", "msg", "fix")                       // flagged
	b = ec.Wrap("slot_lost", nil, "msg", "fix")              // flagged
	c = ec.Is(a, "fenced")                                   // flagged
	d = ec.Is(a, ("fenced"))                                 // flagged
	e = ec.Of(a) == "fenced"                                 // flagged
	f = "fenced" != ec.Of(a)                                 // flagged
	g = &ec.Error{Code: "fenced", Msg: "m"}                  // flagged
	h = ec.Code("fenced")                                    // flagged
	i = []step{{"one", "fenced"}, {name: "two", code: "x"}}  // flagged twice
	j = map[string]ec.Code{"stmt": "sql_statement"}          // flagged
	k = []error{ec.New("blocked", "m", "")}                  // flagged
	l = []struct{ code ec.Code }{{code: "paused"}}           // flagged

	ok1 = ec.New(ec.Fenced, "fenced", "fix")
	ok2 = ec.Is(a, ec.Fenced) && ec.Of(a) != ""
	ok3 = []step{{"fenced", ec.Fenced}}
	ok4 = map[string]string{"fenced": "fenced"}
	ok5 = []struct{ name string }{{"fenced"}}
)
`
	f, err := parser.ParseFile(token.NewFileSet(), "p.go", src, 0)
	if err != nil {
		t.Fatal(err)
	}
	got := literalCodes(f, "ec")
	if len(got) != 13 {
		for _, l := range got {
			t.Log(l.Value)
		}
		t.Fatalf("found %d literal codes, want 13", len(got))
	}
}
