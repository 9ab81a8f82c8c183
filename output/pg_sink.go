package output

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redpanda-data/benthos/v4/public/bloblang"
	"github.com/redpanda-data/benthos/v4/public/service"

	"github.com/pgrelay/pgrelay/internal/confread"
	"github.com/pgrelay/pgrelay/internal/errcode"
	"github.com/pgrelay/pgrelay/internal/pgconnect"
	"github.com/pgrelay/pgrelay/internal/sink"
	"github.com/pgrelay/pgrelay/internal/speclint"
)

// Field names of the pg_sink output (the connection fields are pgconnect's).
const (
	psFieldName                = "name"
	psFieldTable               = "table"
	psFieldTables              = "tables"
	psFieldMode                = "mode"
	psFieldKey                 = "key"
	psFieldStatement           = "statement"
	psFieldParams              = "params"
	psFieldMetadata            = "metadata"
	psFieldProgressTable       = "progress_table"
	psFieldCreateProgressTable = "create_progress_table"
	psFieldRequireProgress     = "require_progress"
	psFieldMaxInFlight         = "max_in_flight"
	psFieldRetryMaxWait        = "retry_max_wait"
	psFieldUnknownKeys         = "unknown_keys"
	psFieldOnUnmappedTable     = "on_unmapped_table"
)

// Limits of pg_sink's numeric fields.
// The on_unmapped_table options.
const (
	psUnmappedFail = "fail"
	psUnmappedSkip = "skip"
)

const (
	psMaxInFlight   = 256
	psDefaultFlight = 4
)

// psMetadataColumns are metadata's fields and where each goes in sink.MetadataColumns.
var psMetadataColumns = []struct {
	field string
	col   func(*sink.MetadataColumns) *string
	doc   string
}{
	{"partition", func(m *sink.MetadataColumns) *string { return &m.Partition }, "Column for the message's partition."},
	{"shard", func(m *sink.MetadataColumns) *string { return &m.Shard }, "Column for the queue shard."},
	{"offset", func(m *sink.MetadataColumns) *string { return &m.Offset }, "Column for the shard offset."},
	{"message_id", func(m *sink.MetadataColumns) *string { return &m.MessageID }, "Column for the message id."},
	{"transaction_id", func(m *sink.MetadataColumns) *string { return &m.TransactionID }, "Column for the source transaction id."},
	{"created_at", func(m *sink.MetadataColumns) *string { return &m.CreatedAt }, "Column for the created-at time (a timestamp column gets a timestamp, a number column milliseconds)."},
	{"payload", func(m *sink.MetadataColumns) *string { return &m.Payload }, "Column for the whole payload (json, jsonb or text)."},
}

// PgSinkSpec is the pg_sink output's config spec.
func PgSinkSpec() *service.ConfigSpec {
	var metadata []*service.ConfigField
	for _, m := range psMetadataColumns {
		metadata = append(metadata, service.NewStringField(m.field).Description(m.doc).Default(""))
	}
	metaNames := "@" + strings.Join(sink.MetaParams, ", @")
	return service.NewConfigSpec().
		Beta().
		Version("0.1.0").
		Categories("Services").
		Summary("Writes messages into a PostgreSQL table exactly once, in append, upsert, cdc or sql mode.").
		Description(`Each batch is one PostgreSQL transaction that also moves the sink's progress rows
(`+"`progress_table`"+`, one row per queue shard): messages at or below their shard's committed offset
are skipped, so a redelivered batch changes nothing twice. With the `+"`redis_queue`"+` input this is
exactly-once; messages without queue/shard/offset metadata are refused unless `+"`require_progress: false`"+`
(then they are written at-least-once).

The target table is never created or altered; it is checked at start (exists, key, writable columns,
privileges). Payload keys map to the columns of exactly the same name; a column the message does not
name keeps its value on update and gets its DEFAULT on insert; a key that names no column is left out
with a warning, or pauses the sink until the table has the column (`+"`unknown_keys`"+`). Values are
converted by PostgreSQL from the exact text the producer wrote.

Errors: transient ones (connection, deadlock, serialization) are retried inside the output; a data
error (SQLSTATE classes 21, 22, 23, 27, 44, 54, P0 or an unreadable payload) fails that message only
("SQLSTATE: message (detail)"), the rest of its shard in the batch is returned unapplied with code
`+"`blocked`"+`, and the rest of the batch commits; environment errors (missing table, privileges,
class 42) pause the sink with a coded error until fixed.`).
		Fields(pgconnect.Fields()...).
		Fields(
			service.NewStringField(psFieldName).Description("The sink's identity in the progress table. Keep it stable: a new name starts over from the queue's first offsets.").
				LintRule(fmt.Sprintf(`root = if this == "" { [%q] }`, psFieldName+" must not be empty")),
			service.NewStringField(psFieldTable).Description("Target table, `schema.name` (quote as in SQL: `public.\"Orders\"`). Not used in mode sql.").Default(""),
			service.NewStringMapField(psFieldTables).Description("Mode cdc, instead of `table`: copies of several tables in one sink. Maps each change event's `table` (`schema.name` as pg_cdc writes it, `schema.*` for every table of a schema, `*` for every table) to its target (`schema.name` quoted as in `table`, or `schema.*` / `*` for the event table's own name, in that schema / in its own schema). An entry by name wins over `schema.*`, which wins over `*`. The events of every table commit in one transaction per batch, with the progress rows; an event no entry maps is a `table_unmapped` data error. Each target's key is its primary key (or replica-identity index): `key` is not used.").
				Example(map[string]any{"public.*": "replica.*"}).Example(map[string]any{"public.orders": "copy.orders", "public.order_items": "copy.items"}).Default(map[string]any{}),
			service.NewStringAnnotatedEnumField(psFieldMode, map[string]string{
				string(sink.ModeAppend): "Insert every message as a new row.",
				string(sink.ModeUpsert): "Insert, or update on the key the columns the message names.",
				string(sink.ModeCDC):    "Apply pgrelay change events (from `pg_cdc`): c/r/u upsert `after` minus `unchanged`, a key change moves the row, d deletes, t truncates, and an envelope (x) applies its events in order, whole or not at all.",
				string(sink.ModeSQL):    "Run `statement` once per message with `params`.",
			}).Description("How messages change the table."),
			service.NewStringAnnotatedEnumField(psFieldOnUnmappedTable, map[string]string{
				psUnmappedFail: "A data error (`table_unmapped`): the input dead-letters the event after `max_attempts`.",
				psUnmappedSkip: "Skip the event (it counts as applied, its offset moves on) and log the table once at info: for a queue whose other tables other sinks copy.",
			}).Description("Mode cdc with `tables`: what to do with a change event whose table no entry maps.").Default(psUnmappedFail),
			service.NewStringAnnotatedEnumField(psFieldUnknownKeys, map[string]string{
				string(sink.UnknownKeysIgnore): "Leave such keys out, silently.",
				string(sink.UnknownKeysWarn):   "Leave them out, and log a warning (`target_column_missing`) the first time each key is met.",
				string(sink.UnknownKeysPause):  "Pause the sink (`target_column_missing`, retried) until the table has the column: nothing of the batch is written without it, nothing is dead-lettered; within a retry of `ALTER TABLE ... ADD COLUMN` the sink writes it. For copies that must not drop a column added at the source.",
			}).Description("What to do with a payload key (mode cdc: a key of `after`) that names no column of the target: a column added to the source that the copy lacks, or a producer's typo. Not used in mode sql.").
				Default(string(sink.UnknownKeysWarn)),
			service.NewStringListField(psFieldKey).Description("Conflict key columns (upsert, cdc); default the primary key, else the replica-identity index. Must match a unique index.").Default([]any{}),
			service.NewStringField(psFieldStatement).Description("Mode sql: the statement, with `$1..$n` for `params`. Cast params in the statement (`$1::numeric`): they arrive as text. Several statements separated by `;` run in order for each message, each seeing what the ones before it changed; `$n` is the same params entry in all of them.").
				Example("UPDATE accounts SET balance = balance + $1::numeric WHERE id = $2::bigint").Default(""),
			service.NewStringListField(psFieldParams).Description("Mode sql: one entry per `$n`: a path into the JSON payload (`$`, `$.a.b`, `$.lines[0]`, `$[\"odd.key\"]`) or "+metaNames+" (`@created_at` in ms). A missing path is NULL.").
				Example([]string{"$.amount", "$.id"}).Default([]any{}).
				LintRule(fmt.Sprintf(`root = if this.type() == "string" && !this.re_match(%s) { [%q] }`, speclint.Quote(psParamPattern()),
					psFieldParams+` entries must be paths ($, $.a.b, $.lines[0], $["odd.key"]) or `+metaNames)),
			service.NewObjectField(psFieldMetadata, metadata...).Description("Target columns filled from message metadata (append, upsert, cdc)."),
			service.NewStringField(psFieldProgressTable).Description("The progress table, `schema.name`.").Default(sink.DefaultProgressTable).
				LintRule(fmt.Sprintf(`root = if !this.re_match("^[^.]+[.][^.]+$") { [%q] }`, psFieldProgressTable+" must be schema.name")),
			service.NewBoolField(psFieldCreateProgressTable).Description("Create the progress table (and its schema) when missing; with false a missing or wrong table is an error printing the DDL.").Default(true),
			service.NewBoolField(psFieldRequireProgress).Description("Refuse messages without queue/shard/offset metadata (they cannot be deduplicated). With false they are written at-least-once.").Default(true).Advanced(),
			service.NewIntField(psFieldMaxInFlight).Description(fmt.Sprintf("Batches written in parallel (transactions over different shards), 1-%d; the pool has one more connection.", psMaxInFlight)).Default(psDefaultFlight).
				LintRule(speclint.Int(psFieldMaxInFlight, 1, psMaxInFlight)),
			service.NewDurationField(psFieldRetryMaxWait).Description("Longest wait between retries of a transient or environment error.").Default("10s").Advanced().
				LintRule(speclint.DurationMin(psFieldRetryMaxWait, 0)),
		).
		LintRule(speclint.Rule(append(pgconnect.LintChecks(), pgSinkChecks()...)...)).
		Example("Upsert orders from a queue", "Applies the change events pg_cdc wrote into the queue `orders` to a copy of the table, exactly once; every replica of this pipeline shares the queue's shards through the group.", `
input:
  redis_queue:
    url: ${REDIS_URL:redis://127.0.0.1:6379}
    queue: orders
    group: orders-copy
output:
  pg_sink:
    dsn: ${TARGET_DSN:postgres://pgrelay@127.0.0.1:5432/copy}
    name: orders-copy
    table: public.orders
    mode: cdc
`).
		Example("Non-idempotent statement, exactly once", "Adds each message's amount to an account balance. The statement is not idempotent, but the progress row committed in the same transaction makes a redelivered message a skip, never a second addition.", `
output:
  pg_sink:
    dsn: ${TARGET_DSN:postgres://pgrelay@127.0.0.1:5432/bank}
    name: balances
    mode: sql
    statement: UPDATE accounts SET balance = balance + $1::numeric WHERE id = $2::bigint
    params: [ $.amount, $.id ]
`)
}

// psParamPattern is what a params entry may be: a path as the sink parses it, or @ and a metadata
// name.
func psParamPattern() string {
	return `^(\$(\.[^.\[\]]+|\["([^"\\]|\\.)*" *\]|\[\+?[0-9]+\])*|@(` + strings.Join(sink.MetaParams, "|") + `))$`
}

// pgSinkChecks are the component-wide checks: the combinations of mode, table, key, statement,
// params and metadata that cannot work (sink.Config.Validate refuses the same).
func pgSinkChecks() []string {
	sql := string(sink.ModeSQL)
	placeholders := fmt.Sprintf(`this.%s.or("").pg_placeholders()`, psFieldStatement)
	tables := fmt.Sprintf(`this.%s.or({})`, psFieldTables)
	return []string{
		speclint.Check(fmt.Sprintf(`this.%s.or("") == %q && this.%s.or("") == ""`, psFieldMode, sql, psFieldStatement), "mode sql needs a statement"),
		speclint.CheckExpr(fmt.Sprintf(`this.%s.or("") != %q && this.%s.or("") == "" && %s.length() == 0`, psFieldMode, sql, psFieldTable, tables), fmt.Sprintf(`"mode " + this.%s.or("") + " needs a table"`, psFieldMode)),
		speclint.Check(fmt.Sprintf(`this.%s.or("") != %q && %s.length() > 0`, psFieldMode, string(sink.ModeCDC), tables), "tables is only used in mode cdc"),
		speclint.Check(fmt.Sprintf(`this.%s.or(%q) != %q && %s.length() == 0`, psFieldOnUnmappedTable, psUnmappedFail, psUnmappedFail, tables), "on_unmapped_table is only used with tables (mode cdc)"),
		speclint.Check(fmt.Sprintf(`this.%s.or("") != "" && %s.length() > 0`, psFieldTable, tables), "table and tables are both set: keep one"),
		speclint.Check(fmt.Sprintf(`this.%s.or([]).length() > 0 && %s.length() > 0`, psFieldKey, tables), "key is not used with tables (each target's own key is used)"),
		speclint.Check(fmt.Sprintf(`%s.key_values().any(kv -> !(kv.key == "*" || kv.key.re_match("^[^.*]+[.]([*]|[^*]+)$")) || kv.value == "" || (kv.value.contains("*") || kv.key.has_suffix("*")) && !(kv.value == "*" || kv.value.re_match("^[^*]+[.][*]$")))`, tables),
			"tables entries must map schema.name, schema.* or * to schema.name, schema.* or * (a pattern to a pattern)"),
		speclint.Check(fmt.Sprintf(`this.%s.or("") != %q && (this.%s.or("") != "" || this.%s.or([]).length() > 0)`, psFieldMode, sql, psFieldStatement, psFieldParams), "statement and params are only used in mode sql"),
		speclint.Check(fmt.Sprintf(`[%q, %q].contains(this.%s.or("")) && this.%s.or([]).length() > 0`, sql, string(sink.ModeAppend), psFieldMode, psFieldKey), "key is only used in modes upsert and cdc"),
		speclint.Check(fmt.Sprintf(`this.%s.or("") == %q && this.%s.or("") != ""`, psFieldMode, sql, psFieldTable), "table is not used in mode sql: name it in the statement"),
		speclint.Check(fmt.Sprintf(`this.%s.or("") == %q && this.%s.or("") == %q`, psFieldMode, sql, psFieldUnknownKeys, string(sink.UnknownKeysPause)), "unknown_keys: pause is not used in mode sql (its params name what they read)"),
		speclint.Check(fmt.Sprintf(`this.%s.or("") == %q && this.%s.or({}).values().any(v -> v != "")`, psFieldMode, sql, psFieldMetadata), "metadata columns are not used in mode sql: use @partition, @offset... params"),
		speclint.Check(fmt.Sprintf(`this.%s.or("") == %q && %s.(ns -> ns.length() > 0 && (ns.max() != ns.unique().length() || ns.contains(0)))`, psFieldMode, sql, placeholders), "statement must number its placeholders $1..$n without gaps"),
		speclint.Check(fmt.Sprintf(`this.%s.or("") == %q && %s.unique().length() != this.%s.or([]).length()`, psFieldMode, sql, placeholders, psFieldParams), "params must have one entry per $n placeholder in statement"),
	}
}

func init() {
	// Used by pg_sink's lint rule, so it is registered before the spec is built.
	bloblang.MustRegisterMethodV2("pg_placeholders",
		bloblang.NewPluginSpec().Category("String Manipulation").
			Description("The numbers of the placeholders `$n` of PostgreSQL statements, in order: those outside string literals, quoted identifiers, dollar-quoted strings and comments.").
			Example("", `root = this.sql.pg_placeholders()`, [2]string{`{"sql":"UPDATE t SET a = $2, b = '$9' WHERE id = $1 -- $3"}`, `[2,1]`}),
		func(*bloblang.ParsedParams) (bloblang.Method, error) {
			return bloblang.StringMethod(func(s string) (any, error) {
				out := []any{}
				for _, n := range sink.Placeholders(s) {
					out = append(out, int64(n))
				}
				return out, nil
			}), nil
		})
	service.MustRegisterBatchOutput("pg_sink", PgSinkSpec(),
		func(conf *service.ParsedConfig, mgr *service.Resources) (service.BatchOutput, service.BatchPolicy, int, error) {
			c, err := PgSinkConfigFromParsed(conf)
			if err != nil {
				return nil, service.BatchPolicy{}, 0, err
			}
			return newPGSink(c, mgr), service.BatchPolicy{}, c.MaxInFlight, nil
		})
}

// PgSinkConfig is a parsed pg_sink section.
type PgSinkConfig struct {
	Sink        sink.Config
	Conn        pgconnect.Config
	MaxInFlight int
	maxConns    int
}

// PgSinkConfigFromParsed reads a pg_sink section parsed with PgSinkSpec and validates it.
func PgSinkConfigFromParsed(conf *service.ParsedConfig) (PgSinkConfig, error) {
	var c PgSinkConfig
	var err error
	if c.Conn, err = pgconnect.Parse(conf); err != nil {
		return c, err
	}
	r := confread.New(conf)
	c.Sink.Name = r.String(psFieldName)
	c.Sink.Table = r.String(psFieldTable)
	c.Sink.Tables = r.StringMap(psFieldTables)
	c.Sink.Mode = sink.Mode(r.String(psFieldMode))
	c.Sink.Statement = r.String(psFieldStatement)
	c.Sink.ProgressTable = r.String(psFieldProgressTable)
	for _, m := range psMetadataColumns {
		*m.col(&c.Sink.Metadata) = r.String(psFieldMetadata, m.field)
	}
	c.Sink.Key = r.StringList(psFieldKey)
	c.Sink.Params = r.StringList(psFieldParams)
	c.Sink.CreateProgressTable = r.Bool(psFieldCreateProgressTable)
	c.Sink.RequireProgress = r.Bool(psFieldRequireProgress)
	c.MaxInFlight = r.Int(psFieldMaxInFlight)
	c.Sink.RetryMax = r.Duration(psFieldRetryMaxWait)
	c.Sink.UnknownKeys = sink.UnknownKeys(r.String(psFieldUnknownKeys))
	unmapped := r.String(psFieldOnUnmappedTable)
	c.Sink.SkipUnmapped = unmapped == psUnmappedSkip
	if err := r.Err(); err != nil {
		return c, err
	}
	if unmapped != psUnmappedFail && unmapped != psUnmappedSkip {
		return c, errcode.New(errcode.SinkConfig, fmt.Sprintf("unknown %s %q", psFieldOnUnmappedTable, unmapped), "use fail or skip")
	}
	if c.MaxInFlight < 1 || c.MaxInFlight > psMaxInFlight {
		return c, errcode.New(errcode.SinkConfig, fmt.Sprintf("%s %d is not in 1-%d", psFieldMaxInFlight, c.MaxInFlight, psMaxInFlight),
			fmt.Sprintf("set %s to 1-%d", psFieldMaxInFlight, psMaxInFlight))
	}
	c.maxConns = c.MaxInFlight + 1
	c.Conn.ApplicationName = "pgrelay-sink-" + c.Sink.Name
	if err := c.Conn.Validate(); err != nil {
		return c, err // pg_config, naming the field and the fix
	}
	return c, c.Sink.Validate()
}

// pgSink is the Benthos shell over sink.Applier.
type pgSink struct {
	conf PgSinkConfig
	log  *service.Logger
	m    sinkMetrics

	mu      sync.Mutex
	pool    *pgxpool.Pool
	applier *sink.Applier
	rc      reconnect // a write that found PostgreSQL not answering: Connect waits until it does
}

// sinkMetrics are the sink's counters (DESIGN §8); dead letters are counted by the input.
type sinkMetrics struct {
	applied, skipped, failed, blocked, batches, errors *service.MetricCounter
	lastError, paused                                  *service.MetricGauge
}

func newPGSink(c PgSinkConfig, mgr *service.Resources) *pgSink {
	m := mgr.Metrics()
	log := mgr.Logger().With("sink", c.Sink.Name)
	unknown := m.NewCounter("pg_sink_unknown_keys", "sink")
	c.Sink.OnUnknownKey = func(warning error) {
		log.Warnf("%v", warning)
		unknown.Incr(1, c.Sink.Name)
	}
	c.Sink.OnUnmapped = func(table string) {
		log.Infof("change events of table %s match no entry of tables: skipped (%s: %s)", table, psFieldOnUnmappedTable, psUnmappedSkip)
	}
	c.Sink.OnOtherTable = func(first, table string) {
		log.Warnf("change events of table %s reach this sink besides those of %s: with %s, mode cdc applies every event to %s whatever its table; "+
			"to keep copies of several tables use %s, or route other tables' events elsewhere", table, first, psFieldTable, c.Sink.Table, psFieldTables)
	}
	return &pgSink{conf: c, log: log, m: sinkMetrics{
		applied:   m.NewCounter("pg_sink_applied", "sink"),
		skipped:   m.NewCounter("pg_sink_skipped", "sink"),
		failed:    m.NewCounter("pg_sink_failed", "sink"),
		blocked:   m.NewCounter("pg_sink_blocked", "sink"),
		batches:   m.NewCounter("pg_sink_batches", "sink"),
		errors:    m.NewCounter("pg_sink_errors", "sink", "class", "code"),
		lastError: m.NewGauge("pg_sink_last_error_timestamp_seconds", "sink"),
		paused:    m.NewGauge("pg_sink_paused", "sink"),
	}}
}

// sinkIdleConns is how many of the pool's connections stay open however long the sink idles (the
// pool closes the others after a minute idle): a batch after a pause then needs no new connection
// and backend, which made a projection's next document take 13–18 ms instead of 3.5–5.4.
const sinkIdleConns = 1

// Check runs the sink's start checks against its PostgreSQL and changes nothing (`pgrelay
// check`): the connection, the progress table (creates: missing, and the sink will create it), the
// target table and its privileges, or in sql mode the statements.
func (c PgSinkConfig) Check(ctx context.Context) (creates bool, err error) {
	pcfg, err := c.Conn.PoolConfig(1)
	if err != nil {
		return false, err
	}
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return false, err
	}
	defer pool.Close()
	creates, err = sink.Check(ctx, pool, c.Sink)
	return creates, pgconnect.Explain(err)
}

// Connect opens the pool, creates or checks the progress table and inspects the target. Its coded
// errors are logged by Benthos, which retries Connect with backoff. After a write found PostgreSQL
// not answering (sink.ErrUnreachable: WriteBatch reported not connected, so /ready answers 503),
// it pings the server until it answers; Benthos then writes the batch again.
func (s *pgSink) Connect(ctx context.Context) error {
	s.mu.Lock()
	open := s.pool
	s.mu.Unlock()
	if open != nil {
		if err := s.rc.await(ctx, open.Ping); err != nil {
			err = pgconnect.Explain(err)
			s.countError(err, sink.Classify(err))
			return err
		}
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.pool != nil { // opened meanwhile
		return nil
	}
	pcfg, err := s.conf.Conn.PoolConfig(s.conf.maxConns)
	if err != nil {
		return err
	}
	pcfg.MinConns = sinkIdleConns
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return err
	}
	a, err := sink.NewApplier(ctx, pool, s.conf.Sink, s.onRetry)
	if err != nil {
		err = pgconnect.Explain(err) // a TLS or pg_hba.conf refusal gets its code and fix
		pool.Close()
		s.countError(err, sink.Classify(err)) // a server that does not answer is transient, not a pause
		return err
	}
	s.pool, s.applier = pool, a
	s.m.paused.Set(0, s.conf.Sink.Name)
	return nil
}

func (s *pgSink) onRetry(err error, class sink.Class, wait time.Duration) {
	s.countError(err, class)
	if class == sink.Transient {
		s.log.Warnf("retrying in %v after a transient error: %v", wait.Round(time.Millisecond), err)
		return
	}
	s.log.Errorf("paused (retrying in %v): %v", wait.Round(time.Millisecond), err)
}

func (s *pgSink) countError(err error, class sink.Class) {
	code := string(errcode.Of(err))
	if code == "" {
		code = "unknown"
	}
	s.m.errors.Incr(1, s.conf.Sink.Name, class.String(), code)
	s.m.lastError.Set(time.Now().Unix(), s.conf.Sink.Name)
	if class == sink.Environment {
		s.m.paused.Set(1, s.conf.Sink.Name) // until a batch commits or Connect succeeds
	}
}

// WriteBatch writes the batch in one transaction; per-message data errors come back as a BatchError.
func (s *pgSink) WriteBatch(ctx context.Context, batch service.MessageBatch) error {
	s.mu.Lock()
	a := s.applier
	s.mu.Unlock()
	if a == nil {
		return service.ErrNotConnected
	}
	msgs := make([]*sink.Message, len(batch))
	slab := make([]sink.Message, len(batch)) // one allocation for the batch, not one per message
	for i, m := range batch {
		if err := toSinkMessage(m, &slab[i]); err != nil {
			return err
		}
		msgs[i] = &slab[i]
	}
	res, err := a.Write(ctx, msgs)
	if errors.Is(err, sink.ErrUnreachable) {
		s.countError(err, sink.Transient)
		return s.rc.lost(s.log, err)
	}
	s.rc.wrote()
	if err != nil {
		s.countError(err, sink.Environment)
		return err
	}
	name := s.conf.Sink.Name
	s.m.paused.Set(0, name)
	s.m.batches.Incr(1, name)
	s.m.applied.Incr(int64(res.Applied), name)
	s.m.skipped.Incr(int64(res.Skipped), name)
	s.m.failed.Incr(int64(res.Failed), name)
	s.m.blocked.Incr(int64(res.Blocked), name)
	if res.Failed == 0 && res.Blocked == 0 {
		return nil
	}
	var bErr *service.BatchError
	for i, e := range res.Errs {
		if e == nil {
			continue
		}
		if res.Outcomes[i] == sink.Failed {
			s.log.Warnf("message %s (queue %s shard %d offset %d) failed: %v", msgs[i].MessageID, msgs[i].Queue, msgs[i].Shard, msgs[i].Offset, e)
		}
		if bErr == nil {
			bErr = service.NewBatchError(batch, e)
		}
		bErr = bErr.Failed(i, e)
	}
	return bErr
}

// toSinkMessage reads the redis_queue metadata (DESIGN §6) and the payload into sm. The redis_queue
// input sets shard, offset and created_at as integers, read as they are; other inputs may set strings.
func toSinkMessage(m *service.Message, sm *sink.Message) error {
	payload, err := m.AsBytes()
	if err != nil {
		return err
	}
	*sm = sink.Message{Payload: payload}
	get := func(k string) string { v, _ := m.MetaGet(k); return v }
	sm.Queue, sm.Partition, sm.MessageID, sm.TransactionID = metaText(m, "queue"), metaText(m, "partition"), metaText(m, "message_id"), metaText(m, "transaction_id")
	shard, okS := metaInt(m, "shard")
	offset, okO := metaInt(m, "offset")
	if sm.Queue != "" && okS && okO && shard == int64(int32(shard)) {
		sm.Shard, sm.Offset, sm.HasPosition = int32(shard), offset, true
	} else if get("offset") != "" || get("shard") != "" {
		return errcode.New(errcode.BadMetadata, fmt.Sprintf("message metadata queue=%q shard=%q offset=%q is not a queue position", sm.Queue, get("shard"), get("offset")),
			"leave queue, shard and offset metadata as the redis_queue input sets them")
	}
	if ms, ok := metaInt(m, "created_at"); ok {
		sm.CreatedAt = ms
	}
	return nil
}

// metaText is a metadata value as a string ("" when absent).
func metaText(m *service.Message, key string) string {
	v, ok := m.MetaGetMut(key)
	if !ok {
		return ""
	}
	if s, ok := v.(string); ok {
		return s
	}
	s, _ := m.MetaGet(key)
	return s
}

// metaInt is a metadata value as an integer: an int64 as set, or any other value's text parsed.
func metaInt(m *service.Message, key string) (int64, bool) {
	v, ok := m.MetaGetMut(key)
	if !ok {
		return 0, false
	}
	if n, ok := v.(int64); ok {
		return n, true
	}
	s, _ := m.MetaGet(key)
	n, err := strconv.ParseInt(s, 10, 64)
	return n, err == nil
}

// Close closes the pool.
func (s *pgSink) Close(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.pool != nil {
		s.pool.Close()
		s.pool, s.applier = nil, nil
	}
	return nil
}
