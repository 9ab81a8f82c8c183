package refdocs

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestReferencePagesMatchTheSpecs fails when a committed page of docs/reference differs from what
// its spec renders (run `go generate ./internal/refdocs` after changing a spec).
func TestReferencePagesMatchTheSpecs(t *testing.T) {
	for _, p := range Pages {
		want, err := Render(p)
		if err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile(filepath.Join("..", "..", "docs", "reference", p.File))
		if err != nil {
			t.Fatalf("%v (run go generate ./internal/refdocs)", err)
		}
		if strings.TrimRight(string(got), "\n") != string(want) {
			t.Errorf("docs/reference/%s differs from its spec: run go generate ./internal/refdocs", p.File)
		}
	}
}

// TestReferencePagesDocumentEveryField: every field of every spec has a heading, a type and no
// placeholder text, and every spec has a version and described examples.
func TestReferencePagesDocumentEveryField(t *testing.T) {
	for _, p := range Pages {
		text, err := Render(p)
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range p.Components {
			view, _ := configView(c)
			data, err := view.TemplateData()
			if err != nil {
				t.Fatal(err)
			}
			if data.Version == "" || len(data.Examples) == 0 {
				t.Errorf("%s %s: version %q, %d examples", c.Kind, c.Name, data.Version, len(data.Examples))
			}
			for _, e := range data.Examples {
				if strings.TrimSpace(e.Summary) == "" {
					t.Errorf("%s %s: example %q has no description", c.Kind, c.Name, e.Title)
				}
			}
			for _, f := range data.Fields {
				if !strings.Contains(string(text), "### `"+f.FullName+"`") {
					t.Errorf("%s %s: no heading for %s", c.Kind, c.Name, f.FullName)
				}
			}
		}
		for _, bad := range []string{"Sorry! This field is missing documentation.", "DESIGN §", "resources/", ".lua"} {
			if strings.Contains(string(text), bad) {
				t.Errorf("%s says %q", p.File, bad)
			}
		}
	}
}
