package sink

import (
	"context"
	"errors"
	"fmt"
	"slices"
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
		} else if !slices.Contains(types, typ) {
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

// Lock begins the batch's transaction on conn, inserts the missing progress rows of shards, locks
// all of them in key order (so two writers of the same shards queue instead of deadlocking) and
// returns each shard's last_offset: one round trip. Rows it has seen before are only locked (no
// INSERT); if one vanished (a teardown), it is inserted again.
func (p *Progress) Lock(ctx context.Context, conn *pgx.Conn, shards []ShardKey) (map[ShardKey]int64, error) {
	if len(shards) == 0 {
		if _, err := conn.Exec(ctx, "BEGIN"); err != nil {
			return nil, fmt.Errorf("begin: %w", err)
		}
		return map[ShardKey]int64{}, nil
	}
	queues, nums, allKnown := p.sorted(shards)
	out, err := p.lockRows(ctx, conn, queues, nums, !allKnown)
	if err == nil && len(out) != len(queues) && allKnown {
		if _, err = conn.Exec(ctx, "ROLLBACK"); err == nil {
			out, err = p.lockRows(ctx, conn, queues, nums, true)
		}
	}
	if err != nil {
		return nil, err
	}
	if len(out) != len(queues) {
		return nil, errors.New("lock progress rows: a progress row vanished inside the transaction")
	}
	p.markKnown(shards)
	return out, nil
}

// sorted returns shards' queues and numbers in key order (the order rows are locked in) and
// whether every row has been seen before.
func (p *Progress) sorted(shards []ShardKey) (queues []string, nums []int32, allKnown bool) {
	sorted := append([]ShardKey(nil), shards...)
	sort.Slice(sorted, func(i, j int) bool {
		if sorted[i].Queue != sorted[j].Queue {
			return sorted[i].Queue < sorted[j].Queue
		}
		return sorted[i].Shard < sorted[j].Shard
	})
	queues, nums = make([]string, len(sorted)), make([]int32, len(sorted))
	allKnown = true
	p.mu.Lock()
	defer p.mu.Unlock()
	for i, s := range sorted {
		queues[i], nums[i] = s.Queue, s.Shard
		allKnown = allKnown && p.known[s]
	}
	return queues, nums, allKnown
}

// markKnown records that the rows of shards exist (committed or locked by this sink).
func (p *Progress) markKnown(shards []ShardKey) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, s := range shards {
		p.known[s] = true
	}
}

// insertStmt inserts the missing rows of the shards (in key order) at offset 0.
func (p *Progress) insertStmt(queues []string, nums []int32) stmt {
	return stmt{sql: `INSERT INTO ` + p.ident + ` (sink, queue, shard, last_offset)
			SELECT $1, u.q, u.s, 0 FROM unnest($2::text[], $3::int[]) WITH ORDINALITY AS u(q, s, n) ORDER BY u.n
			ON CONFLICT (sink, queue, shard) DO NOTHING`, args: []any{p.sink, queues, nums}}
}

func (p *Progress) lockRows(ctx context.Context, conn *pgx.Conn, queues []string, nums []int32, insert bool) (map[ShardKey]int64, error) {
	b := &pgx.Batch{}
	b.Queue("BEGIN")
	if insert {
		s := p.insertStmt(queues, nums)
		b.Queue(s.sql, s.args...)
	}
	b.Queue(`SELECT p.queue, p.shard, p.last_offset FROM `+p.ident+` p
		JOIN unnest($2::text[], $3::int[]) AS u(q, s) ON p.queue = u.q AND p.shard = u.s
		WHERE p.sink = $1 ORDER BY p.queue COLLATE "C", p.shard FOR UPDATE OF p`, p.sink, queues, nums)
	br := conn.SendBatch(ctx, b)
	defer br.Close()
	if _, err := br.Exec(); err != nil {
		return nil, fmt.Errorf("begin: %w", err)
	}
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

// guardMoved is the text the guard fails with (as an integer cast, SQLSTATE 22P02) when a
// shard's offset is not below the batch's first offset for it, or a progress row is missing.
const guardMoved = "pgrelay: progress moved"

// guardStmts are the fast path's first statements (see Applier.fast): the missing progress rows
// inserted, then the guard, which locks the rows of the shards of first in key order and fails
// with guardMoved unless each shard's last_offset is below first[shard], the batch's lowest
// offset for it — that is, unless no message of the batch is to be skipped.
func (p *Progress) guardStmts(first map[ShardKey]int64) []stmt {
	shards := make([]ShardKey, 0, len(first))
	for k := range first {
		shards = append(shards, k)
	}
	queues, nums, allKnown := p.sorted(shards)
	offs := make([]int64, len(queues))
	for i := range queues {
		offs[i] = first[ShardKey{Queue: queues[i], Shard: nums[i]}]
	}
	var out []stmt
	if !allKnown {
		out = append(out, p.insertStmt(queues, nums))
	}
	return append(out, stmt{sql: `WITH locked AS (SELECT p.last_offset, u.o FROM ` + p.ident + ` p
		JOIN unnest($2::text[], $3::int[], $4::bigint[]) AS u(q, s, o) ON p.queue = u.q AND p.shard = u.s
		WHERE p.sink = $1 ORDER BY p.queue COLLATE "C", p.shard FOR UPDATE OF p)
		SELECT (CASE WHEN count(*) = $5 AND coalesce(bool_and(last_offset < o), true) THEN '1' ELSE '` + guardMoved + `' END)::int FROM locked`,
		args: []any{p.sink, queues, nums, offs, len(queues)}})
}

// isGuardMoved reports whether err is the guard's refusal.
func isGuardMoved(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "22P02" && strings.Contains(pgErr.Message, guardMoved)
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
