package sink

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgrelay/pgrelay/internal/errcode"
	"github.com/pgrelay/pgrelay/resources"
)

// DefaultProgressTable is where sinks record the last committed offset of each shard (DESIGN §7).
const DefaultProgressTable = "pgrelay.sink_progress"

// Progress is the progress table of one sink: it locks, reads and moves per-shard offsets inside the
// batch's transaction.
type Progress struct {
	sink         string
	schema, name string // unquoted
	ident        string // quoted schema.table
	ddl          string // the schema and the table
	tableDDL     string // the table alone, for a schema that exists

	mu    sync.Mutex
	known map[ShardKey]bool // rows seen to exist: Lock skips their INSERT
}

// ShardKey names one shard of one queue.
type ShardKey struct {
	Queue string
	Shard int32
}

// NewProgress describes the progress table `table` ("schema.name") for the sink named sink.
func NewProgress(sink, table string) (*Progress, error) {
	schema, name, ok := strings.Cut(table, ".")
	if !ok || schema == "" || name == "" || strings.Contains(name, ".") {
		return nil, errcode.New(errcode.ProgressTableName, fmt.Sprintf("progress_table %q is not schema.name", table),
			"write progress_table as schema.name, e.g. pgrelay.sink_progress")
	}
	ident := pgx.Identifier{schema, name}.Sanitize()
	createSchema := "CREATE SCHEMA IF NOT EXISTS " + pgx.Identifier{schema}.Sanitize() + ";"
	ddl := resources.MustRead("sink_progress.sql")
	ddl = strings.ReplaceAll(ddl, "CREATE SCHEMA IF NOT EXISTS pgrelay;", createSchema)
	ddl = strings.ReplaceAll(ddl, "pgrelay.sink_progress (", ident+" (")
	return &Progress{sink: sink, schema: schema, name: name, ident: ident, ddl: ddl,
		tableDDL: strings.Replace(ddl, createSchema, "", 1), known: map[ShardKey]bool{}}, nil
}

// progressPrivileges are what a sink does with its progress rows: reads them, inserts a shard's
// first row, and locks (SELECT ... FOR UPDATE) and moves them.
var progressPrivileges = []string{"SELECT", "INSERT", "UPDATE"}

// AdminSQL is what an administrator runs to create the table for a sink whose role may not: the
// DDL and the grants of role.
func (p *Progress) AdminSQL(role string) string {
	r := pgx.Identifier{role}.Sanitize()
	return p.DDL() + "\nGRANT USAGE ON SCHEMA " + pgx.Identifier{p.schema}.Sanitize() + " TO " + r + ";\nGRANT " +
		strings.Join(progressPrivileges, ", ") + " ON " + p.ident + " TO " + r + ";"
}

// DDL is the statement that creates the table, printed when a hand-made one is wrong.
func (p *Progress) DDL() string { return ddlStatements(p.ddl) }

// ddlStatements drops the SQL comments of the resource file.
func ddlStatements(s string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if !strings.HasPrefix(strings.TrimSpace(l), "--") && strings.TrimSpace(l) != "" {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// Ensure creates the table when create is true and the role may (CREATE on the schema, and on the
// database while the schema does not exist), serialised by an advisory lock so replicas starting
// together are fine; then it checks the table's shape and the role's privileges on it either way.
// An administrator may create it instead (AdminSQL, printed by the errors).
func (p *Progress) Ensure(ctx context.Context, pool *pgxpool.Pool, create bool) error {
	var role, db string
	var schemaExists, usage, exists bool
	err := pool.QueryRow(ctx, `SELECT current_user, current_database(), n.oid IS NOT NULL,
		  coalesce(has_schema_privilege(n.oid, 'USAGE'), false), c.oid IS NOT NULL
		FROM (SELECT) x LEFT JOIN pg_namespace n ON n.nspname = $1
		LEFT JOIN pg_class c ON c.relnamespace = n.oid AND c.relname = $2`, p.schema, p.name).
		Scan(&role, &db, &schemaExists, &usage, &exists)
	if err != nil {
		return fmt.Errorf("look up progress table %s: %w", p.ident, err)
	}
	r := pgx.Identifier{role}.Sanitize()
	switch {
	case schemaExists && !usage:
		return errcode.New(errcode.ProgressTablePrivileges, fmt.Sprintf("role %s may not use schema %s of the progress table %s", role, p.schema, p.ident),
			"GRANT USAGE ON SCHEMA "+pgx.Identifier{p.schema}.Sanitize()+" TO "+r)
	case !exists && !create:
		return errcode.New(errcode.ProgressTableMissing, fmt.Sprintf("progress table %s does not exist", p.ident),
			"create it as an administrator:\n"+p.AdminSQL(role)+"\nor set create_progress_table: true (pg_sink then creates it when its role has CREATE on the schema)")
	case !exists:
		if err := p.create(ctx, pool, schemaExists, role, db); err != nil {
			return err
		}
	}
	if err := p.check(ctx, pool); err != nil {
		return err
	}
	return p.checkPrivileges(ctx, pool)
}

func (p *Progress) create(ctx context.Context, pool *pgxpool.Pool, schemaExists bool, role, db string) error {
	ddl := p.ddl
	if schemaExists {
		ddl = p.tableDDL // CREATE SCHEMA IF NOT EXISTS needs CREATE on the database even when the schema exists
	}
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtext('pgrelay.sink_progress:' || $1))`, p.ident); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, ddl)
		return err
	})
	if err == nil {
		return nil
	}
	r := pgx.Identifier{role}.Sanitize()
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "42501" {
		grant := "GRANT CREATE ON SCHEMA " + pgx.Identifier{p.schema}.Sanitize() + " TO " + r + " (pg_sink then creates the table)"
		if !schemaExists {
			grant = "GRANT CREATE ON DATABASE " + pgx.Identifier{db}.Sanitize() + " TO " + r + " (pg_sink then creates the schema and the table)"
		}
		return errcode.Wrap(errcode.ProgressTableCreate, err, fmt.Sprintf("role %s may not create the progress table %s", role, p.ident),
			grant+", or create it as an administrator:\n"+p.AdminSQL(role))
	}
	return errcode.Wrap(errcode.ProgressTableCreate, err, fmt.Sprintf("cannot create progress table %s", p.ident),
		"create it as an administrator:\n"+p.AdminSQL(role))
}

// checkPrivileges returns a progress_table_privileges error naming the GRANT when the role lacks a
// privilege the sink uses on the progress table.
func (p *Progress) checkPrivileges(ctx context.Context, q Querier) error {
	var role string
	var missing []string
	err := q.QueryRow(ctx, `SELECT current_user, coalesce(array_agg(x ORDER BY n) FILTER (WHERE NOT has_table_privilege(to_regclass($1), x)), '{}')
		FROM unnest($2::text[]) WITH ORDINALITY u(x, n)`, p.ident, progressPrivileges).Scan(&role, &missing)
	if err != nil {
		return fmt.Errorf("check privileges on progress table %s: %w", p.ident, err)
	}
	if len(missing) == 0 {
		return nil
	}
	return errcode.New(errcode.ProgressTablePrivileges, fmt.Sprintf("role %s lacks %s on the progress table %s", role, strings.Join(missing, ", "), p.ident),
		"GRANT "+strings.Join(missing, ", ")+" ON "+p.ident+" TO "+pgx.Identifier{role}.Sanitize())
}

// check compares the table with the expected columns and primary key.
func (p *Progress) check(ctx context.Context, q Querier) error {
	rows, err := q.Query(ctx, `SELECT a.attname, format_type(a.atttypid, a.atttypmod),
		  coalesce(a.attnum = ANY (i.indkey::int2[]), false)
		FROM pg_attribute a LEFT JOIN pg_index i ON i.indrelid = a.attrelid AND i.indisprimary
		WHERE a.attrelid = to_regclass($1) AND a.attnum > 0 AND NOT a.attisdropped`, p.ident)
	if err != nil {
		return fmt.Errorf("check progress table %s: %w", p.ident, err)
	}
	got := map[string]string{}
	var pk []string
	for rows.Next() {
		var name, typ string
		var inPK bool
		if err := rows.Scan(&name, &typ, &inPK); err != nil {
			rows.Close()
			return fmt.Errorf("check progress table %s: %w", p.ident, err)
		}
		got[name] = typ
		if inPK {
			pk = append(pk, name)
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return fmt.Errorf("check progress table %s: %w", p.ident, err)
	}
	want := map[string][]string{"sink": {"text"}, "queue": {"text"}, "shard": {"integer", "bigint"},
		"last_offset": {"bigint"}, "updated_at": {"timestamp with time zone"}}
	var problems []string
	for col, types := range want {
		if typ, ok := got[col]; !ok {
			problems = append(problems, "no column "+col)
		} else if !contains(types, typ) {
			problems = append(problems, fmt.Sprintf("column %s is %s, not %s", col, typ, types[0]))
		}
	}
	if !sameSet(pk, []string{"sink", "queue", "shard"}) {
		problems = append(problems, fmt.Sprintf("primary key is %v, not (sink, queue, shard)", pk))
	}
	if len(problems) > 0 {
		sort.Strings(problems)
		return errcode.New(errcode.ProgressTableMismatch, fmt.Sprintf("progress table %s does not have the expected shape: %s", p.ident, strings.Join(problems, "; ")),
			"drop it (when no sink uses it) or point progress_table elsewhere; the expected table is:\n"+p.DDL())
	}
	return nil
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// Lock inserts the missing progress rows of shards, locks all of them in key order (so two writers
// of the same shards queue instead of deadlocking) and returns each shard's last_offset. Rows it
// has seen before are only locked (no INSERT); if one vanished (a teardown), it is inserted again.
func (p *Progress) Lock(ctx context.Context, tx pgx.Tx, shards []ShardKey) (map[ShardKey]int64, error) {
	if len(shards) == 0 {
		return map[ShardKey]int64{}, nil
	}
	sorted := append([]ShardKey(nil), shards...)
	sort.Slice(sorted, func(i, j int) bool {
		if sorted[i].Queue != sorted[j].Queue {
			return sorted[i].Queue < sorted[j].Queue
		}
		return sorted[i].Shard < sorted[j].Shard
	})
	queues := make([]string, len(sorted))
	nums := make([]int32, len(sorted))
	allKnown := true
	p.mu.Lock()
	for i, s := range sorted {
		queues[i], nums[i] = s.Queue, s.Shard
		allKnown = allKnown && p.known[s]
	}
	p.mu.Unlock()
	out, err := p.lockRows(ctx, tx, queues, nums, !allKnown)
	if err == nil && len(out) != len(sorted) && allKnown {
		out, err = p.lockRows(ctx, tx, queues, nums, true)
	}
	if err != nil {
		return nil, err
	}
	if len(out) != len(sorted) {
		return nil, errors.New("lock progress rows: a progress row vanished inside the transaction")
	}
	p.mu.Lock()
	for _, s := range sorted {
		p.known[s] = true
	}
	p.mu.Unlock()
	return out, nil
}

func (p *Progress) lockRows(ctx context.Context, tx pgx.Tx, queues []string, nums []int32, insert bool) (map[ShardKey]int64, error) {
	b := &pgx.Batch{}
	if insert {
		b.Queue(`INSERT INTO `+p.ident+` (sink, queue, shard, last_offset)
			SELECT $1, u.q, u.s, 0 FROM unnest($2::text[], $3::int[]) WITH ORDINALITY AS u(q, s, n) ORDER BY u.n
			ON CONFLICT (sink, queue, shard) DO NOTHING`, p.sink, queues, nums)
	}
	b.Queue(`SELECT p.queue, p.shard, p.last_offset FROM `+p.ident+` p
		JOIN unnest($2::text[], $3::int[]) AS u(q, s) ON p.queue = u.q AND p.shard = u.s
		WHERE p.sink = $1 ORDER BY p.queue COLLATE "C", p.shard FOR UPDATE OF p`, p.sink, queues, nums)
	br := tx.SendBatch(ctx, b)
	defer br.Close()
	if insert {
		if _, err := br.Exec(); err != nil {
			return nil, fmt.Errorf("insert progress rows: %w", err)
		}
	}
	rows, err := br.Query()
	if err != nil {
		return nil, fmt.Errorf("lock progress rows: %w", err)
	}
	out := make(map[ShardKey]int64, len(queues))
	for rows.Next() {
		var k ShardKey
		var off int64
		if err := rows.Scan(&k.Queue, &k.Shard, &off); err != nil {
			rows.Close()
			return nil, fmt.Errorf("lock progress rows: %w", err)
		}
		out[k] = off
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("lock progress rows: %w", err)
	}
	return out, br.Close()
}

// advanceStmt moves each shard's last_offset up to offsets[shard]; it never moves one backwards.
func (p *Progress) advanceStmt(offsets map[ShardKey]int64) (stmt, bool) {
	if len(offsets) == 0 {
		return stmt{}, false
	}
	var queues []string
	var nums []int32
	var offs []int64
	for k, o := range offsets {
		queues, nums, offs = append(queues, k.Queue), append(nums, k.Shard), append(offs, o)
	}
	return stmt{sql: `UPDATE ` + p.ident + ` p SET last_offset = u.o, updated_at = now()
		FROM unnest($2::text[], $3::int[], $4::bigint[]) AS u(q, s, o)
		WHERE p.sink = $1 AND p.queue = u.q AND p.shard = u.s AND p.last_offset < u.o`,
		args: []any{p.sink, queues, nums, offs}}, true
}
