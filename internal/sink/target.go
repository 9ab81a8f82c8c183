package sink

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgrelay/pgrelay/internal/errcode"
)

// valueKind says how a column's value travels from the payload's JSON to PostgreSQL.
type valueKind int

const (
	// kindText: the JSON string unquoted (or the number/bool as written), cast by the column type's input function.
	kindText valueKind = iota
	// kindJSON: json/jsonb columns get the JSON value exactly as the producer wrote it.
	kindJSON
	// kindPopulate: arrays and composites are built by jsonb_populate_record from the JSON value.
	kindPopulate
)

// Column is one column of the target table as the catalog describes it.
type Column struct {
	Name           string    // exact attname
	Num            int       // attnum
	CastType       string    // the type to cast text to, without a typmod (applied by assignment): format_type(atttypid, NULL), but "bpchar" and "bit" for character(n) and bit(n), whose plain names mean a length of 1
	Type           string    // format_type(atttypid, atttypmod), for messages
	Kind           valueKind // how values are converted
	Generated      bool      // attgenerated <> '': never written
	IdentityAlways bool      // attidentity = 'a': written with OVERRIDING SYSTEM VALUE, never updated
	Datetime       bool      // base type is in the datetime category (metadata created_at as a timestamp)
	BaseType       uint32    // OID of the type, or of a domain's base type (picks the COPY binary encoder)
	// Required is NOT NULL (or of a NOT NULL domain, or named by a CHECK constraint: `CHECK (c IS
	// NOT NULL)`) without a default (its own or a domain's; no identity, not generated): an upsert
	// that does not
	// name it must still give it a value, since PostgreSQL checks NOT NULL on the row it would
	// insert before it finds the conflict (see writer.insertSQL).
	Required bool
}

// Target is the sink's table as read from pg_catalog at start and after schema errors.
type Target struct {
	OID          uint32
	Version      string // catalog row versions of the table and its columns (see shapeVersion)
	Schema, Name string
	Columns      []Column
	byName       map[string]int
	Key          []string // columns of the conflict key (primary key, replica-identity index or configured)
}

// Ident is the quoted, schema-qualified table name.
func (t *Target) Ident() string { return pgx.Identifier{t.Schema, t.Name}.Sanitize() }

// Column returns the column named exactly name.
func (t *Target) Column(name string) (*Column, bool) {
	i, ok := t.byName[name]
	if !ok {
		return nil, false
	}
	return &t.Columns[i], true
}

// TargetNeeds lists what a mode needs from the table; Inspect turns each miss into a coded error.
type TargetNeeds struct {
	Key        []string // configured key; empty = primary key, else replica-identity index
	NeedKey    bool     // upsert and cdc
	Privileges []string // INSERT, UPDATE, DELETE, SELECT
	Columns    []string // columns that must exist and be writable (metadata columns)
}

const columnsQuery = `
WITH RECURSIVE base(attnum, typ, depth) AS (
    SELECT a.attnum, a.atttypid, 0 FROM pg_attribute a WHERE a.attrelid = $1 AND a.attnum > 0 AND NOT a.attisdropped
  UNION ALL
    SELECT b.attnum, t.typbasetype, b.depth + 1 FROM base b JOIN pg_type t ON t.oid = b.typ WHERE t.typtype = 'd'
)
SELECT a.attname, a.attnum,
       CASE a.atttypid WHEN 'bpchar'::regtype THEN 'bpchar' WHEN 'bit'::regtype THEN '"bit"' ELSE format_type(a.atttypid, NULL) END,
       format_type(a.atttypid, a.atttypmod),
       a.attgenerated <> '', a.attidentity = 'a',
       (a.attnotnull OR EXISTS (SELECT 1 FROM base d JOIN pg_type dt ON dt.oid = d.typ WHERE d.attnum = a.attnum AND dt.typtype = 'd' AND dt.typnotnull)
          OR EXISTS (SELECT 1 FROM pg_constraint k WHERE k.conrelid = a.attrelid AND k.contype = 'c' AND a.attnum = ANY(k.conkey)))
         AND NOT a.atthasdef AND a.attidentity = '' AND a.attgenerated = ''
         AND NOT EXISTS (SELECT 1 FROM base d JOIN pg_type dt ON dt.oid = d.typ WHERE d.attnum = a.attnum AND dt.typdefault IS NOT NULL),
       bt.typname IN ('json', 'jsonb'), bt.typcategory = 'A' OR bt.typtype = 'c', bt.typcategory = 'D', bt.oid
FROM pg_attribute a
JOIN LATERAL (SELECT typ FROM base WHERE base.attnum = a.attnum ORDER BY depth DESC LIMIT 1) b ON true
JOIN pg_type bt ON bt.oid = b.typ
WHERE a.attrelid = $1 AND a.attnum > 0 AND NOT a.attisdropped
ORDER BY a.attnum`

// Inspect reads the target table's shape and checks it against needs. It never changes anything.
func Inspect(ctx context.Context, q Querier, table string, needs TargetNeeds) (*Target, error) {
	var oid uint32
	var relkind string
	t := &Target{byName: map[string]int{}}
	err := q.QueryRow(ctx, `SELECT c.oid, n.nspname, c.relname, c.relkind::text FROM pg_class c
		JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = to_regclass($1)`, table).
		Scan(&oid, &t.Schema, &t.Name, &relkind)
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "42501" { // a schema the role may not use
		return nil, schemaUsageError(ctx, q, table, err)
	}
	if errors.Is(err, pgx.ErrNoRows) {
		if other := otherCase(ctx, q, table); other != "" {
			return nil, errcode.New(errcode.TargetMissing, fmt.Sprintf("table %s does not exist, but %s does", table, other),
				"names are taken as in SQL: unquoted ones in lower case, quoted ones as written; set `table` to "+other)
		}
		return nil, errcode.New(errcode.TargetMissing, fmt.Sprintf("table %s does not exist (or is not on the search_path)", table),
			"create the table first (pg_sink never creates or alters it) or fix `table` (schema.name, quoted as in SQL)")
	}
	if err != nil {
		return nil, fmt.Errorf("inspect table %q: %w", table, err)
	}
	if relkind != "r" && relkind != "p" {
		return nil, errcode.New(errcode.TargetNotTable, fmt.Sprintf("%s is not a table (relkind %s)", t.Ident(), relkind),
			"point `table` at an ordinary or partitioned table")
	}
	t.OID = oid
	if t.Version, err = shapeVersion(ctx, q, oid); err != nil {
		return nil, err
	}
	if err := t.readColumns(ctx, q, oid); err != nil {
		return nil, err
	}
	if err := t.checkColumns(needs.Columns); err != nil {
		return nil, err
	}
	if err := t.resolveKey(ctx, q, oid, needs); err != nil {
		return nil, err
	}
	return t, t.checkPrivileges(ctx, q, oid, needs.Privileges)
}

// Querier is what Inspect and the progress table need: a pool, a connection or a transaction.
type Querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// shapeVersion changes whenever ALTER TABLE touches the table or one of its columns: it is the
// transaction ids that last wrote their catalog rows.
func shapeVersion(ctx context.Context, q Querier, oid uint32) (string, error) {
	v, err := shapeVersions(ctx, q, []uint32{oid})
	return v[oid], err
}

// shapeVersions is shapeVersion of several tables in one query.
func shapeVersions(ctx context.Context, q Querier, oids []uint32) (map[uint32]string, error) {
	rows, err := q.Query(ctx, `SELECT o.oid, coalesce((SELECT xmin::text FROM pg_class WHERE oid = o.oid), 'gone') || ':' ||
		coalesce((SELECT string_agg(xmin::text, ',' ORDER BY attnum) FROM pg_attribute WHERE attrelid = o.oid AND attnum > 0), '')
		FROM unnest($1::oid[]) AS o(oid)`, oids)
	if err != nil {
		return nil, fmt.Errorf("read the table's catalog version: %w", err)
	}
	defer rows.Close()
	out := make(map[uint32]string, len(oids))
	for rows.Next() {
		var oid uint32
		var v string
		if err := rows.Scan(&oid, &v); err != nil {
			return nil, fmt.Errorf("read the table's catalog version: %w", err)
		}
		out[oid] = v
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read the table's catalog version: %w", err)
	}
	return out, nil
}

func (t *Target) readColumns(ctx context.Context, q Querier, oid uint32) error {
	rows, err := q.Query(ctx, columnsQuery, oid)
	if err != nil {
		return fmt.Errorf("read columns of %s: %w", t.Ident(), err)
	}
	defer rows.Close()
	for rows.Next() {
		var c Column
		var isJSON, isPopulate bool
		if err := rows.Scan(&c.Name, &c.Num, &c.CastType, &c.Type, &c.Generated, &c.IdentityAlways, &c.Required,
			&isJSON, &isPopulate, &c.Datetime, &c.BaseType); err != nil {
			return fmt.Errorf("read columns of %s: %w", t.Ident(), err)
		}
		switch {
		case isJSON:
			c.Kind = kindJSON
		case isPopulate:
			c.Kind = kindPopulate
		}
		t.byName[c.Name] = len(t.Columns)
		t.Columns = append(t.Columns, c)
	}
	return rows.Err()
}

func (t *Target) checkColumns(names []string) error {
	for _, n := range names {
		c, ok := t.Column(n)
		if !ok {
			return errcode.New(errcode.TargetColumnMissing, fmt.Sprintf("%s has no column %q", t.Ident(), n),
				"add the column to the table or change the `metadata` column names (names are exact and case-sensitive)")
		}
		if c.Generated {
			return errcode.New(errcode.TargetColumnGenerated, fmt.Sprintf("column %q of %s is generated and cannot be written", n, t.Ident()),
				"name a writable column in `metadata`")
		}
	}
	return nil
}

// resolveKey fills t.Key: the configured key (which must match a unique index usable by ON CONFLICT),
// else the primary key, else the replica-identity index.
func (t *Target) resolveKey(ctx context.Context, q Querier, oid uint32, needs TargetNeeds) error {
	rows, err := q.Query(ctx, `SELECT i.indisprimary, i.indisreplident,
		  i.indisunique AND i.indimmediate AND i.indisvalid AND i.indpred IS NULL AND i.indexprs IS NULL,
		  array(SELECT a.attname FROM unnest(i.indkey::int2[]) WITH ORDINALITY k(num, ord)
		        JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.num ORDER BY k.ord)
		FROM pg_index i WHERE i.indrelid = $1 AND i.indisunique ORDER BY i.indisprimary DESC, i.indisreplident DESC`, oid)
	if err != nil {
		return fmt.Errorf("read indexes of %s: %w", t.Ident(), err)
	}
	type index struct {
		primary, replident, usable bool
		cols                       []string
	}
	var idx []index
	for rows.Next() {
		var x index
		if err := rows.Scan(&x.primary, &x.replident, &x.usable, &x.cols); err != nil {
			rows.Close()
			return fmt.Errorf("read indexes of %s: %w", t.Ident(), err)
		}
		idx = append(idx, x)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return fmt.Errorf("read indexes of %s: %w", t.Ident(), err)
	}
	if len(needs.Key) > 0 {
		for _, k := range needs.Key {
			if _, ok := t.Column(k); !ok {
				return errcode.New(errcode.KeyColumnMissing, fmt.Sprintf("key column %q is not a column of %s", k, t.Ident()),
					"fix `key` (exact, case-sensitive column names)")
			}
		}
		for _, x := range idx {
			if x.usable && sameSet(x.cols, needs.Key) {
				t.Key = append([]string(nil), needs.Key...)
				return nil
			}
		}
		if needs.NeedKey {
			return errcode.New(errcode.KeyNotUnique, fmt.Sprintf("no unique, non-partial, non-deferrable index of %s covers exactly the key %v", t.Ident(), needs.Key),
				"create a unique index (or primary key) on exactly those columns, or change `key`")
		}
		t.Key = append([]string(nil), needs.Key...)
		return nil
	}
	for _, x := range idx {
		if (x.primary || x.replident) && x.usable {
			t.Key = x.cols
			return nil
		}
	}
	if needs.NeedKey {
		return errcode.New(errcode.TargetNoKey, fmt.Sprintf("%s has no primary key and no replica-identity index", t.Ident()),
			"add a primary key, set REPLICA IDENTITY USING INDEX, or name a unique index's columns in `key`")
	}
	return nil
}

// checkPrivileges returns a target_privileges error naming the GRANT when the role lacks one of
// privs on the table.
func (t *Target) checkPrivileges(ctx context.Context, q Querier, oid uint32, privs []string) error {
	var role string
	var missing []string
	// Column privileges are enough for INSERT, UPDATE and SELECT; DELETE and TRUNCATE are the table's.
	err := q.QueryRow(ctx, `SELECT current_user, coalesce(array_agg(p ORDER BY n) FILTER (WHERE NOT CASE WHEN p IN ('DELETE', 'TRUNCATE')
		  THEN has_table_privilege($1::oid, p) ELSE has_any_column_privilege($1::oid, p) END), '{}')
		FROM unnest($2::text[]) WITH ORDINALITY u(p, n)`, oid, privs).Scan(&role, &missing)
	if err != nil {
		return fmt.Errorf("check privileges on %s: %w", t.Ident(), err)
	}
	if len(missing) > 0 {
		return errcode.New(errcode.TargetPrivileges, fmt.Sprintf("role %s lacks %s on %s", role, strings.Join(missing, ", "), t.Ident()),
			fmt.Sprintf("GRANT %s ON %s TO %s", strings.Join(missing, ", "), t.Ident(), pgx.Identifier{role}.Sanitize()))
	}
	return nil
}

// otherCase returns the one table whose name differs from table's only in letter case, written as
// `table` takes it (quoted where SQL needs it), or "" when there is none (or more than one).
func otherCase(ctx context.Context, q Querier, table string) string {
	var schema, name string
	err := q.QueryRow(ctx, `SELECT n.nspname, c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace,
		LATERAL (SELECT parse_ident($1) AS p) i
		WHERE c.relkind IN ('r', 'p') AND lower(c.relname) = lower(i.p[array_length(i.p, 1)])
		  AND (array_length(i.p, 1) = 1 AND n.nspname = ANY (current_schemas(false)) OR lower(n.nspname) = lower(i.p[1]))`, table).Scan(&schema, &name)
	if err != nil { // none, several, or a name parse_ident refuses
		return ""
	}
	return sqlName(schema) + "." + sqlName(name)
}

// sqlName writes an identifier as SQL reads it back: bare when it is lower case, else quoted.
func sqlName(s string) string {
	for i, r := range s {
		if !(r >= 'a' && r <= 'z' || r == '_' || i > 0 && (r >= '0' && r <= '9' || r == '$')) {
			return pgx.Identifier{s}.Sanitize()
		}
	}
	return s
}

// checkSchema checks that the target schema of a `schema.*` entry of tables (SQL text) exists and
// that the role may use it: its tables are found only as events come, so a typo or a missing grant
// is told at start instead of pausing the sink at the first event.
func checkSchema(ctx context.Context, q Querier, schema, entry string) error {
	var name, role string
	var usable bool
	err := q.QueryRow(ctx, `SELECT n.nspname, current_user, has_schema_privilege(n.oid, 'USAGE')
		FROM pg_namespace n WHERE n.oid = to_regnamespace($1)`, schema).Scan(&name, &role, &usable)
	if errors.Is(err, pgx.ErrNoRows) {
		return errcode.New(errcode.TargetMissing, fmt.Sprintf("schema %s of tables entry %q does not exist", schema, entry),
			"create the schema and its tables first (pg_sink never creates them) or fix the entry (names are taken as in SQL: unquoted ones in lower case)")
	}
	if err != nil {
		return fmt.Errorf("inspect schema %s: %w", schema, err)
	}
	if !usable {
		return errcode.New(errcode.TargetPrivileges, fmt.Sprintf("role %s may not use schema %s of tables entry %q", role, schema, entry),
			"GRANT USAGE ON SCHEMA "+pgx.Identifier{name}.Sanitize()+" TO "+pgx.Identifier{role}.Sanitize())
	}
	return nil
}

// schemaUsageError is the target_privileges error of a table whose schema the role may not use
// (PostgreSQL refuses even to look the table up).
func schemaUsageError(ctx context.Context, q Querier, table string, cause error) error {
	var role, schema string
	if err := q.QueryRow(ctx, `SELECT current_user, (parse_ident($1))[1]`, table).Scan(&role, &schema); err != nil {
		return fmt.Errorf("inspect table %q: %w", table, cause)
	}
	return errcode.Wrap(errcode.TargetPrivileges, cause, fmt.Sprintf("role %s may not use schema %s of table %s", role, schema, table),
		"GRANT USAGE ON SCHEMA "+pgx.Identifier{schema}.Sanitize()+" TO "+pgx.Identifier{role}.Sanitize())
}

func sameSet(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	seen := map[string]bool{}
	for _, x := range a {
		seen[x] = true
	}
	for _, x := range b {
		if !seen[x] {
			return false
		}
	}
	return true
}
