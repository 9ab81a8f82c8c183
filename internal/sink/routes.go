package sink

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/pgrelay/pgrelay/internal/errcode"
)

// Routes maps the tables of change events (their `table` member, `schema.name` as pg_cdc writes it)
// to target tables, for one cdc sink that keeps copies of several tables (Config.Tables). An entry's
// key is an event table (`public.orders`), every table of a schema (`public.*`) or every table
// (`*`); its value the target, `schema.name` with SQL quoting as `table` takes it, or with a `*` in
// the name's place (`copy.*`: the event table's own name, in schema copy; `*` alone: the event
// table's own schema and name). An entry by name wins over its schema's, which wins over `*`.
type Routes struct {
	byName   map[string]string // event table → target
	bySchema map[string]string // event schema → target
	all      string            // the target of `*` ("" none)
}

// ParseRoutes reads the tables map, refusing entries it cannot read (sink_config).
func ParseRoutes(m map[string]string) (Routes, error) {
	r := Routes{byName: map[string]string{}, bySchema: map[string]string{}}
	if len(m) == 0 {
		return r, errcode.New(errcode.SinkConfig, "tables is empty", "map at least one event table (or `*`) to a target")
	}
	for from, to := range m {
		schema, name, ok := strings.Cut(from, ".")
		pattern := from == "*" || ok && name == "*"
		why := ""
		switch {
		case !pattern && (!ok || schema == "" || name == "" || strings.Contains(from, "*")):
			why = "is not an event table (schema.name), schema.* or *"
		case to == "":
			why = "names no target"
		case strings.Contains(to, "*") && !targetPattern(to):
			why = "has a * outside the table name's place (write schema.* or *)"
		case pattern && !targetPattern(to):
			why = "maps several tables onto one (write schema.* or * as the target)"
		}
		if why != "" {
			return r, errcode.New(errcode.SinkConfig, fmt.Sprintf("tables entry %q: %q %s", from, to, why),
				"write each entry as `schema.name`, `schema.*` or `*` (the events' table) mapped to `schema.name`, `schema.*` or `*` (the target, SQL quoting as in `table`)")
		}
		switch {
		case from == "*":
			r.all = to
		case pattern:
			r.bySchema[schema] = to
		default:
			r.byName[from] = to
		}
	}
	return r, nil
}

// targetPattern reports a target that takes the event table's name: `schema.*` or `*`.
func targetPattern(to string) bool {
	s, ok := strings.CutSuffix(to, ".*")
	return to == "*" || ok && s != "" && !strings.Contains(s, "*")
}

// Target is the target table of events of table (`schema.name`, unquoted, as events write it), as
// `table` would name it (SQL text), or false when no entry maps it.
func (r Routes) Target(table string) (string, bool) {
	schema, name, _ := strings.Cut(table, ".")
	to, ok := r.byName[table]
	if !ok {
		to, ok = r.bySchema[schema]
	}
	if !ok {
		to, ok = r.all, r.all != ""
	}
	switch {
	case !ok || name == "" && targetPattern(to):
		return "", false
	case to == "*":
		return pgx.Identifier{schema, name}.Sanitize(), true
	case targetPattern(to):
		return strings.TrimSuffix(to, "*") + pgx.Identifier{name}.Sanitize(), true
	}
	return to, true
}

// names lists the event tables of the entries by name, whose targets a start checks before any
// event comes.
func (r Routes) names() []string {
	return slices.Sorted(maps.Keys(r.byName))
}

// schemaEntry is an entry of tables whose target is `schema.*`: its tables are found as events
// come, its schema (SQL text, as written) is checked at start.
type schemaEntry struct{ entry, schema string }

// schemaEntries lists the entries whose target is `schema.*`, by entry.
func (r Routes) schemaEntries() []schemaEntry {
	var out []schemaEntry
	for from, to := range r.bySchema {
		if s, ok := strings.CutSuffix(to, ".*"); ok {
			out = append(out, schemaEntry{from + ".*", s})
		}
	}
	if s, ok := strings.CutSuffix(r.all, ".*"); ok {
		out = append(out, schemaEntry{"*", s})
	}
	slices.SortFunc(out, func(a, b schemaEntry) int { return strings.Compare(a.entry, b.entry) })
	return out
}

// unmappedError is the data error of an event whose table no entry of tables maps.
func unmappedError(table string) error {
	return errcode.New(errcode.TableUnmapped, fmt.Sprintf("change event of table %q: no entry of tables maps it", table),
		"add an entry for it (or its schema.*) to tables, or route its events to another output; the input dead-letters this message after max_attempts")
}
