// Package refdocs writes the reference pages docs/reference/<plugin>.md from pgrelay's plugin
// specs, as the Benthos environment exposes them (ConfigView.TemplateData and FormatJSON), so the
// pages say exactly what the specs say. `go generate ./internal/refdocs` rewrites them; the package
// test fails when a committed page differs from its spec.
//
// A field's Version is not shown: the fields Benthos supplies (tls, batching) carry Benthos'
// versions, which mean nothing for pgrelay; the component's Version is pgrelay's.
package refdocs

//go:generate go run ./cmd/refdocs ../../docs/reference

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"text/template"

	"github.com/redpanda-data/benthos/v4/public/service"

	_ "github.com/pgrelay/pgrelay/input"            // registers pg_cdc and the redis_queue input
	_ "github.com/pgrelay/pgrelay/internal/metrics" // registers the prometheus exporter
	_ "github.com/pgrelay/pgrelay/output"           // registers pg_sink and the redis_queue output
)

// Page is one reference page: the components of one plugin name.
type Page struct {
	File       string // under docs/reference
	Components []Component
}

// Component is one plugin kind and name.
type Component struct {
	Kind, Name string // "input", "output" or "metrics"
}

// Pages are pgrelay's reference pages.
var Pages = []Page{
	{File: "pg_cdc.md", Components: []Component{{"input", "pg_cdc"}}},
	{File: "redis_queue.md", Components: []Component{{"output", "redis_queue"}, {"input", "redis_queue"}}},
	{File: "pg_sink.md", Components: []Component{{"output", "pg_sink"}}},
	{File: "prometheus.md", Components: []Component{{"metrics", "prometheus"}}},
}

// Render is the text of a page.
func Render(p Page) ([]byte, error) {
	var b bytes.Buffer
	fmt.Fprintf(&b, "<!-- Generated from the plugin specs by `go generate ./internal/refdocs`: edit the specs, not this page. -->\n\n")
	for i, c := range p.Components {
		view, ok := configView(c)
		if !ok {
			return nil, fmt.Errorf("no %s %s registered", c.Kind, c.Name)
		}
		data, err := view.TemplateData()
		if err != nil {
			return nil, err
		}
		unscrubDefaults(&data)
		flags, err := fieldFlags(view)
		if err != nil {
			return nil, err
		}
		if i > 0 {
			b.WriteString("\n")
		}
		if err := page.Execute(&b, struct {
			service.TemplateDataPlugin
			Flags map[string]flag
		}{data, flags}); err != nil {
			return nil, err
		}
	}
	return bytes.TrimRight(b.Bytes(), "\n"), nil
}

func configView(c Component) (*service.ConfigView, bool) {
	env := service.GlobalEnvironment()
	switch c.Kind {
	case "input":
		return env.GetInputConfig(c.Name)
	case "metrics":
		return env.GetMetricsConfig(c.Name)
	}
	return env.GetOutputConfig(c.Name)
}

// flag is what TemplateData leaves out of a field: whether it is optional or advanced.
type flag struct{ Optional, Advanced bool }

// fieldFlags reads the optional and advanced marks of every field, by full name, from the spec's
// JSON form.
func fieldFlags(view *service.ConfigView) (map[string]flag, error) {
	raw, err := view.FormatJSON()
	if err != nil {
		return nil, err
	}
	type field struct {
		Name     string  `json:"name"`
		Kind     string  `json:"kind"`
		Optional bool    `json:"is_optional"`
		Advanced bool    `json:"is_advanced"`
		Children []field `json:"children"`
	}
	var spec struct {
		Config field `json:"config"`
	}
	if err := json.Unmarshal(raw, &spec); err != nil {
		return nil, err
	}
	out := map[string]flag{}
	var walk func(prefix string, fs []field)
	walk = func(prefix string, fs []field) {
		for _, f := range fs {
			name := prefix + f.Name
			out[name] = flag{Optional: f.Optional, Advanced: f.Advanced}
			sub := name
			if f.Kind == "array" {
				sub += "[]"
			}
			walk(sub+".", f.Children)
		}
	}
	walk("", spec.Config.Children)
	return out, nil
}

// unscrubDefaults shows the default of a secret field (a Redis URL on 127.0.0.1, say) in the
// config samples, where Benthos puts its scrubbed placeholder.
func unscrubDefaults(data *service.TemplateDataPlugin) {
	for _, f := range data.Fields {
		var def string
		if !f.IsSecret || json.Unmarshal([]byte(f.DefaultMarshalled), &def) != nil || def == "" {
			continue
		}
		name := f.FullName[strings.LastIndexAny(f.FullName, ".]")+1:]
		scrubbed := regexp.MustCompile(`(?m)^(\s*` + regexp.QuoteMeta(name) + `: )'!!!SECRET_SCRUBBED!!!'$`)
		data.CommonConfigYAML = scrubbed.ReplaceAllString(data.CommonConfigYAML, "${1}"+def)
		data.AdvancedConfigYAML = scrubbed.ReplaceAllString(data.AdvancedConfigYAML, "${1}"+def)
	}
}

// WriteAll writes every page into dir.
func WriteAll(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	for _, p := range Pages {
		text, err := Render(p)
		if err != nil {
			return fmt.Errorf("%s: %w", p.File, err)
		}
		if err := os.WriteFile(filepath.Join(dir, p.File), append(text, '\n'), 0o644); err != nil {
			return err
		}
	}
	return nil
}

var page = template.Must(template.New("page").Funcs(template.FuncMap{
	"trim": strings.TrimSpace,
	"typeName": func(t string) string {
		if t == "unknown" {
			return "any"
		}
		return t
	},
	"code": func(s string) string {
		if s == "" {
			return "`\"\"`"
		}
		if strings.Contains(s, "`") {
			return "`` " + s + " ``"
		}
		return "`" + s + "`"
	},
	"anchor": func(s string) string {
		return strings.NewReplacer(".", "", "[", "", "]", "", "<", "", ">", "").Replace(strings.ToLower(s))
	},
}).Parse(`# ` + "`{{.Name}}`" + ` {{.Type}}

{{.Status}}{{if .Version}} · since pgrelay {{.Version}}{{end}}

{{trim .Summary}}

{{trim .Description}}

## Configuration

Common fields, with their defaults:

` + "```yaml" + `
{{trim .CommonConfigYAML}}
` + "```" + `

Every field:

` + "```yaml" + `
{{trim .AdvancedConfigYAML}}
` + "```" + `

## Fields
{{range .Fields}}{{$f := index $.Flags .FullName}}
### {{code .FullName}}

{{trim .Description}}

Type: ` + "`{{typeName .Type}}`" + `{{if .DefaultMarshalled}} · default: {{code .DefaultMarshalled}}{{else if $f.Optional}} · optional{{else if ne .Type "object"}} · required{{end}}{{if $f.Advanced}} · advanced{{end}}{{if .IsSecret}} · secret{{end}}{{if .IsInterpolated}} · interpolated{{end}}
{{if .AnnotatedOptions}}
| option | meaning |
|---|---|
{{range .AnnotatedOptions}}| {{code (index . 0)}} | {{index . 1}} |
{{end}}{{else if .Options}}
Options: {{range $i, $o := .Options}}{{if $i}}, {{end}}{{code $o}}{{end}}.
{{end}}{{if .ExamplesMarshalled}}
Examples:
{{range .ExamplesMarshalled}}
` + "```yaml" + `
{{trim .}}
` + "```" + `
{{end}}{{end}}{{end}}{{if .Examples}}
## Examples
{{range .Examples}}
### {{.Title}}

{{trim .Summary}}

` + "```yaml" + `
{{trim .Config}}
` + "```" + `
{{end}}{{end}}`))
