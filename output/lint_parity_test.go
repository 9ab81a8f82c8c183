package output

import (
	"testing"

	"github.com/pgrelay/pgrelay/internal/speclint/linttest"
)

// TestPgSinkLintRefusesWhatTheStartRefuses pairs every refusal of pg_sink's start (its parser,
// sink.Config.Validate and the connection checks) with the lint message that refuses the same
// config, and checks both on the config.
func TestPgSinkLintRefusesWhatTheStartRefuses(t *testing.T) {
	start := linttest.Start(PgSinkSpec(), PgSinkConfigFromParsed)
	sql := func(stmt, params string) string {
		return "{table: ~, mode: sql, statement: " + stmt + ", params: " + params + "}"
	}
	cases := []linttest.Case{
		{Name: "valid upsert", Set: "{}"},
		{Name: "valid sql", Set: sql("'UPDATE a SET b = $1::int WHERE id = $2::int'", "[$.b, $.id]")},
		{Name: "empty name", Set: "name: ''", Refused: "name is empty", Lint: "name must not be empty"},
		{Name: "no name", Set: "name: ~", Refused: "name", Lint: "name is required"},
		{Name: "no mode", Set: "mode: ~", Refused: "mode", Lint: "mode is required"},
		{Name: "unknown mode", Set: "mode: merge", Refused: "unknown mode", Lint: "not a valid option"},
		{Name: "upsert without table", Set: "table: ~", Refused: "mode upsert needs a table", Lint: "mode upsert needs a table"},
		{Name: "statement outside sql", Set: "statement: SELECT 1", Refused: "statement and params are for mode sql", Lint: "statement and params are only used in mode sql"},
		{Name: "params outside sql", Set: "params: [$]", Refused: "statement and params are for mode sql", Lint: "statement and params are only used in mode sql"},
		{Name: "sql without statement", Set: "{table: ~, mode: sql}", Refused: "mode sql needs a statement", Lint: "mode sql needs a statement"},
		{Name: "key in sql", Set: "{table: ~, mode: sql, statement: SELECT 1, key: [id]}", Refused: "key and metadata columns are not used in mode sql", Lint: "key is only used in modes upsert and cdc"},
		{Name: "metadata in sql", Set: "{table: ~, mode: sql, statement: SELECT 1, metadata: {offset: off}}", Refused: "key and metadata columns are not used in mode sql", Lint: "metadata columns are not used in mode sql"},
		{Name: "key in append", Set: "{mode: append, key: [id]}", Refused: "key is not used in mode append", Lint: "key is only used in modes upsert and cdc"},
		{Name: "table in sql (lint only)", Set: "{mode: sql, statement: SELECT 1}", Lint: "table is not used in mode sql"},
		{Name: "fewer params than placeholders", Set: sql("'UPDATE a SET b = $1 WHERE id = $2'", "[$.b]"), Refused: "sql_params_mismatch", Lint: "one entry per $n"},
		{Name: "more params than placeholders", Set: sql("'SELECT $1'", "[$.a, $.b]"), Refused: "sql_params_mismatch", Lint: "one entry per $n"},
		{Name: "a gap in the placeholders", Set: sql("'UPDATE a SET b = $1 WHERE id = $3'", "[$.b, $.id]"), Refused: "uses $3 but not $2", Lint: "without gaps"},
		{Name: "placeholders in literals and comments are not placeholders", Set: sql(`"SELECT $1, '$2', \"$3\" -- $4\n /* $5 */ , $$ $6 $$, a$7"`, "[$.a]")},
		{Name: "a placeholder after a literal", Set: sql(`"SELECT 'it''s', $1, $2"`, "[$.a]"), Refused: "sql_params_mismatch", Lint: "one entry per $n"},
		{Name: "nested comments, escapes and tagged dollar quotes", Set: sql(`"SELECT $1 /* a /* $2 */ $3 */, E'\\' $4', $fn$ $5 $fn$"`, "[$.a]")},
		{Name: "an unterminated literal", Set: sql(`"SELECT $1, 'open $2"`, "[$.a]")},
		{Name: "$0", Set: sql("'SELECT $0'", "[]"), Refused: "statement uses $0", Lint: "without gaps"},
		{Name: "several statements share the params", Set: sql("'UPDATE a SET n = n + $1::int WHERE id = $2::int; INSERT INTO log VALUES ($2::int)'", "[$.n, $.id]")},
		{Name: "a param that is not a path", Set: sql("'SELECT $1'", "[amount]"), Refused: "sql_param_path", Lint: "params entries must be paths"},
		{Name: "a path with an empty key", Set: sql("'SELECT $1'", "[$.a..b]"), Refused: "sql_param_path", Lint: "params entries must be paths"},
		{Name: "a path with a bad index", Set: sql("'SELECT $1'", "['$.a[x]']"), Refused: "sql_param_path", Lint: "params entries must be paths"},
		{Name: "paths of every form", Set: sql("'SELECT $1, $2, $3, $4, $5'", `['$', '$.a.b', '$.lines[0]', '$["odd.key"]', '@offset']`)},
		{Name: "an unknown metadata name", Set: sql("'SELECT $1'", "['@lsn']"), Refused: "sql_param_unknown", Lint: "params entries must be paths"},
		{Name: "max_in_flight low", Set: "max_in_flight: 0", Refused: "max_in_flight", Lint: "max_in_flight must be between 1 and 256"},
		{Name: "max_in_flight high", Set: "max_in_flight: 257", Refused: "max_in_flight", Lint: "max_in_flight must be between 1 and 256"},
		{Name: "max_in_flight text", Set: "max_in_flight: many", Refused: "max_in_flight", Unlintable: linttest.TypeError},
		{Name: "retry_max_wait", Set: "retry_max_wait: later", Refused: "retry_max_wait", Lint: "retry_max_wait must be a duration"},
		{Name: "progress table without schema (lint only)", Set: "progress_table: progress", Lint: "progress_table must be schema.name"},
		{Name: "unknown_keys pause", Set: "unknown_keys: pause"},
		{Name: "cdc with tables", Set: `{table: ~, mode: cdc, tables: {"public.*": "copy.*", "public.orders": 'copy."Orders"', "*": "*", "app.t": "app.*"}}`},
		{Name: "tables outside cdc", Set: `{table: ~, tables: {"public.*": "copy.*"}}`, Refused: "tables is for mode cdc, not upsert", Lint: "tables is only used in mode cdc"},
		{Name: "table and tables", Set: `{mode: cdc, tables: {"public.*": "copy.*"}}`, Refused: "table and tables are both set", Lint: "table and tables are both set"},
		{Name: "key with tables", Set: `{table: ~, mode: cdc, key: [id], tables: {"public.*": "copy.*"}}`, Refused: "key is not used with tables", Lint: "key is not used with tables"},
		{Name: "tables: a pattern onto one table", Set: `{table: ~, mode: cdc, tables: {"public.*": "copy.t"}}`, Refused: "maps several tables onto one", Lint: "tables entries must map"},
		{Name: "tables: an event table without schema", Set: `{table: ~, mode: cdc, tables: {"orders": "copy.orders"}}`, Refused: "is not an event table", Lint: "tables entries must map"},
		{Name: "tables: a star in the schema", Set: `{table: ~, mode: cdc, tables: {"*.orders": "copy.orders"}}`, Refused: "is not an event table", Lint: "tables entries must map"},
		{Name: "tables: a star inside a target name", Set: `{table: ~, mode: cdc, tables: {"public.*": "copy.t_*"}}`, Refused: "has a * outside", Lint: "tables entries must map"},
		{Name: "tables: no target", Set: `{table: ~, mode: cdc, tables: {"public.t": ""}}`, Refused: "names no target", Lint: "tables entries must map"},
		{Name: "on_unmapped_table skip with tables", Set: `{table: ~, mode: cdc, tables: {"public.*": "copy.*"}, on_unmapped_table: skip}`},
		{Name: "on_unmapped_table skip without tables", Set: `{mode: cdc, on_unmapped_table: skip}`, Refused: "on_unmapped_table is for mode cdc with tables", Lint: "on_unmapped_table is only used with tables"},
		{Name: "on_unmapped_table skip in sql", Set: `{table: ~, mode: sql, statement: SELECT 1, on_unmapped_table: skip}`, Refused: "on_unmapped_table is for mode cdc with tables", Lint: "on_unmapped_table is only used with tables"},
		{Name: "on_unmapped_table unknown", Set: `{mode: cdc, on_unmapped_table: drop}`, Refused: "on_unmapped_table", Lint: "not a valid option"},
		{Name: "tables in sql", Set: `{table: ~, mode: sql, statement: SELECT 1, tables: {"public.*": "copy.*"}}`, Refused: "tables is for mode cdc, not sql", Lint: "tables is only used in mode cdc"},
		{Name: "unknown_keys unknown", Set: "unknown_keys: fail", Refused: "unknown unknown_keys", Lint: "not a valid option"},
		{Name: "unknown_keys pause in sql", Set: "{table: ~, mode: sql, statement: SELECT 1, unknown_keys: pause}", Refused: "unknown_keys: pause is not used in mode sql", Lint: "unknown_keys: pause is not used in mode sql"},
	}
	cases = append(cases, linttest.PGConnCases()...)
	linttest.Check(t, linttest.Output, "pg_sink", "host: 127.0.0.1\nname: copy\ntable: public.t\nmode: upsert\n", start, cases)
}

// TestRedisQueueOutputLintRefusesWhatTheStartRefuses: the same for the redis_queue output.
func TestRedisQueueOutputLintRefusesWhatTheStartRefuses(t *testing.T) {
	start := linttest.Start(RedisQueueSpec(), RedisQueueConfigFromParsed)
	cases := []linttest.Case{
		{Name: "valid", Set: "{}"},
		{Name: "durability word", Set: "durability: fsync", Refused: "durability:", Lint: "durability must be none, aof or {replicas: N, timeout: 5s}"},
		{Name: "durability number", Set: "durability: 2", Refused: "durability:", Lint: "durability must be none, aof or"},
		{Name: "durability unknown field", Set: "durability: {mode: aof}", Refused: "durability has no field mode", Lint: "durability has no field mode; durability must be none, aof or {replicas: N, timeout: 5s}"},
		{Name: "durability replicas 0", Set: "durability: {replicas: 0}", Refused: "durability.replicas:", Lint: "durability.replicas must be a number, at least 1"},
		{Name: "durability replicas text", Set: "durability: {replicas: two}", Refused: "durability.replicas:", Lint: "durability.replicas must be a number"},
		{Name: "durability timeout", Set: "durability: {replicas: 1, timeout: soon}", Refused: "durability.timeout:", Lint: "durability.timeout must be a duration"},
		{Name: "durability replicas", Set: "durability: {replicas: 1, timeout: 250ms}"},
		{Name: "max_age", Set: "max_age: 1week", Refused: "max_age", Lint: "max_age must be empty or a duration"},
		{Name: "trim_interval 0", Set: "trim_interval: 0s", Refused: "queue_config", Lint: "trim_interval must be a duration above 0s"},
		{Name: "trim_interval text", Set: "trim_interval: often", Refused: "trim_interval", Lint: "trim_interval must be a duration above 0s"},
		{Name: "queue interpolation", Set: `queue: '${! meta("queue" }'`, Refused: "queue", Lint: "expected"},
		{Name: "queue name with a brace", Set: `queue: 'a{b}'`, Refused: "bad_queue", Lint: "queue must be 1-256 bytes without { or }"},
		{Name: "queue name empty", Set: `queue: ''`, Refused: "bad_queue", Lint: "queue must be 1-256 bytes without { or }"},
		{Name: "queue name interpolated with a brace (checked per message)", Set: `queue: '${! meta("q") }{x}'`},
		{Name: "shards 0 (lint only: the writer takes its default)", Set: "shards: 0", Lint: "shards must be between 1 and 1024"},
		{Name: "layout_version 1", Set: "layout_version: 1"},
		{Name: "layout_version 2", Set: "layout_version: 2"},
		{Name: "layout_version 4", Set: "layout_version: 4", Refused: "layout_version: 4 is not 1, 2 or 3", Lint: "layout_version must be between 1 and 3"},
		{Name: "max_script_bytes text", Set: "max_script_bytes: lots", Refused: "max_script_bytes", Unlintable: linttest.TypeError},
		{Name: "metadata filter pattern", Set: "metadata: {include_patterns: ['(']}", Refused: "failed to compile regexp", Lint: "metadata.include_patterns must be regular expressions"},
	}
	cases = append(cases, linttest.RedisConnCases("")...)
	linttest.Check(t, linttest.Output, "redis_queue", "queue: orders\n", start, cases)
}
