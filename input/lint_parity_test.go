package input

import (
	"fmt"
	"strings"
	"testing"

	"github.com/pgrelay/pgrelay/internal/source"
	"github.com/pgrelay/pgrelay/internal/speclint/linttest"
)

// TestPgCDCLintRefusesWhatTheStartRefuses pairs every refusal of pg_cdc's start (its parser and
// source.Config.Validate, with the connection checks) with the lint message that refuses the same
// config, and checks both on the config.
func TestPgCDCLintRefusesWhatTheStartRefuses(t *testing.T) {
	start := linttest.Start(PgCDCSpec(), PgCDCConfigFromParsed)
	// Two queue names in the same Redis Cluster slot, and one in another.
	sameSlot, otherSlot := "", ""
	for i := 0; sameSlot == "" || otherSlot == ""; i++ {
		q := fmt.Sprint("q", i)
		if source.ClusterSlot(q) == source.ClusterSlot("orders") {
			sameSlot = q
		} else {
			otherSlot = q
		}
	}
	tables := func(n int) string {
		var b strings.Builder
		b.WriteString("tables:\n")
		for i := 0; i < n; i++ {
			fmt.Fprintf(&b, "  - {table: t%d, queue: q}\n", i)
		}
		return b.String()
	}
	cases := []linttest.Case{
		{Name: "valid", Set: "{}"},
		{Name: "name", Set: "name: Orders", Refused: "name:", Lint: "name must match"},
		{Name: "slot name", Set: "slot: {name: Bad-Slot}", Refused: "slot.name:", Lint: "slot.name must match"},
		{Name: "publication name", Set: "publication: {name: " + strings.Repeat("p", 64) + "}", Refused: "publication.name:", Lint: "publication.name must be at most 63"},
		{Name: "no tables", Set: "tables: []", Refused: "tables:", Lint: "tables must list 1-256"},
		{Name: "too many tables", Set: tables(source.MaxTables + 1), Refused: "tables:", Lint: "tables must list 1-256"},
		{Name: "table without name", Set: "tables: [{table: public., queue: q}]", Refused: "tables[0].table:", Lint: "tables[].table must match"},
		{Name: "table without schema", Set: "tables: [{table: .t, queue: q}]", Refused: "tables[0].table:", Lint: "tables[].table must match"},
		{Name: "a pattern", Set: `tables: [{table: 'sales.order_*', queue: q}, {table: 'sales.order_archive', queue: q2}]`},
		{Name: "a pattern with exclusions", Set: `tables: [{table: 'sales.*', queue: q, exclude: [sales.audit_*, tmp]}]`},
		{Name: "exclude without a pattern", Set: `tables: [{table: sales.orders, queue: q, exclude: [sales.tmp]}]`, Refused: "tables[0].exclude: is for an entry whose table is a pattern", Lint: "tables[].exclude is for an entry whose table is a pattern"},
		{Name: "exclude with a pattern in the schema", Set: `tables: [{table: '*.*', queue: q, exclude: ['s*.tmp']}]`},
		{Name: "a pattern in the schema", Set: `tables: [{table: 'sales_*.orders', queue: q}]`},
		{Name: "exclude without a schema", Set: `tables: [{table: 'sales.*', queue: q, exclude: ['.tmp']}]`, Refused: "tables[0].exclude: \".tmp\": name tables as table takes them", Lint: "tables[].exclude must name tables as table takes them"},
		{Name: "a pattern in the schema with columns", Set: `tables: [{table: 'sales_*.orders', queue: q, columns: [id]}]`, Refused: "is a pattern: its tables share the entry's options", Lint: "is a pattern: its tables share the entry's options"},
		{Name: "a pattern with columns", Set: `tables: [{table: 'sales.*', queue: q, columns: [id]}]`, Refused: "is a pattern: its tables share the entry's options", Lint: "is a pattern: its tables share the entry's options"},
		{Name: "a pattern partitioned by columns", Set: `tables: [{table: 'order_*', queue: q, partition_by: [region]}]`, Refused: "is a pattern: its tables share the entry's options", Lint: "is a pattern: its tables share the entry's options"},
		{Name: "table in SQL quotes", Set: `tables: [{table: 'public."Order Lines"', queue: q}]`, Refused: "tables[0].table: public.\"Order Lines\" is taken as written", Lint: "tables[].table is taken as written, without SQL quotes: use public.Order Lines"},
		{Name: "a table twice", Set: "tables: [{table: t, queue: q}, {table: public.t, queue: r}]", Refused: "tables[1].table:", Lint: "must not list a table twice"},
		{Name: "empty queue", Set: "tables: [{table: t, queue: ''}]", Refused: "tables[0].queue:", Lint: "tables[].queue must be 1-128 bytes"},
		{Name: "long queue", Set: "tables: [{table: t, queue: " + strings.Repeat("q", source.MaxQueueBytes+1) + "}]", Refused: "tables[0].queue:", Lint: "tables[].queue must be 1-128 bytes"},
		{Name: "queue with a brace", Set: "tables: [{table: t, queue: 'a{b'}]", Refused: "tables[0].queue:", Lint: "tables[].queue must be 1-128 bytes"},
		{Name: "partition_by word", Set: "tables: [{table: t, queue: q, partition_by: nope}]", Refused: "tables[0].partition_by:", Lint: "partition_by must be key, single or a list"},
		{Name: "partition_by empty list", Set: "tables: [{table: t, queue: q, partition_by: []}]", Refused: "tables[0].partition_by:", Lint: "must list at least one column"},
		{Name: "columns twice", Set: "tables: [{table: t, queue: q, columns: [id, v, id]}]", Refused: "tables[0].columns:", Lint: "tables[].columns must list each column once"},
		{Name: "columns empty name", Set: "tables: [{table: t, queue: q, columns: [id, '']}]", Refused: "tables[0].columns:", Lint: "tables[].columns must list each column once"},
		{Name: "columns", Set: "tables: [{table: t, queue: q, columns: [id, v]}]"},
		{Name: "partition_by empty column", Set: "tables: [{table: t, queue: q, partition_by: ['']}]", Refused: "tables[0].partition_by:", Lint: "must list at least one column"},
		{Name: "partition_by number", Set: "tables: [{table: t, queue: q, partition_by: 5}]", Refused: "tables[0].partition_by:", Lint: "partition_by must be key, single or a list"},
		{Name: "truncate emit by key", Set: "truncate: emit", Refused: "truncate:", Lint: "truncate: emit needs partition_by: single"},
		{Name: "truncate emit, single", Set: "{truncate: emit, tables: [{table: t, queue: q, partition_by: single}]}"},
		{Name: "truncate value", Set: "truncate: drop", Refused: "truncate:", Lint: "not a valid option"},
		{Name: "snapshot value", Set: "snapshot: always", Refused: "snapshot:", Lint: "not a valid option"},
		{Name: "on_refused_table value", Set: "on_refused_table: ignore", Refused: "on_refused_table:", Lint: "not a valid option"},
		{Name: "publication name with append-only tables", Set: "{publication: {name: " + strings.Repeat("p", 57) + "}, tables: [{table: t, queue: q, append_only: true, partition_by: single}]}",
			Refused: "publication.name:", Lint: "publication.name must be at most 56 bytes with append-only tables"},
		{Name: "publication name of 56 with append-only tables", Set: "{publication: {name: " + strings.Repeat("p", 56) + "}, tables: [{table: t, queue: q, append_only: true, partition_by: single}]}"},
		{Name: "lease_ttl low", Set: "lease_ttl: 2s", Refused: "lease_ttl:", Lint: "lease_ttl must be a duration between 3s and 2m0s"},
		{Name: "lease_ttl high", Set: "lease_ttl: 121s", Refused: "lease_ttl:", Lint: "lease_ttl must be a duration between"},
		{Name: "lease_ttl not a duration", Set: "lease_ttl: 10", Refused: "lease_ttl", Lint: "lease_ttl must be a duration between"},
		{Name: "linger negative", Set: "linger: -1ms", Refused: "linger:", Lint: "linger must be a duration between 0s and 5s"},
		{Name: "linger high", Set: "linger: 6s", Refused: "linger:", Lint: "linger must be a duration between"},
		{Name: "load_linger negative", Set: "load_linger: -1ms", Refused: "load_linger:", Lint: "load_linger must be a duration between 0s and 5s"},
		{Name: "load_linger high", Set: "load_linger: 6s", Refused: "load_linger:", Lint: "load_linger must be a duration between"},
		{Name: "heartbeat low", Set: "heartbeat: 500ms", Refused: "heartbeat:", Lint: "heartbeat must be a duration between 1s and 1h0m0s"},
		{Name: "heartbeat high", Set: "heartbeat: 2h", Refused: "heartbeat:", Lint: "heartbeat must be a duration between"},
		{Name: "max_bundle_messages low", Set: "max_bundle_messages: 0", Refused: "max_bundle_messages:", Lint: "max_bundle_messages must be between 1 and 50000"},
		{Name: "max_bundle_messages high", Set: "max_bundle_messages: 50001", Refused: "max_bundle_messages:", Lint: "max_bundle_messages must be between"},
		{Name: "max_bundle_messages text", Set: "max_bundle_messages: many", Refused: "max_bundle_messages", Unlintable: linttest.TypeError},
		{Name: "publish_function text", Set: "publish_function: maybe", Refused: "publish_function", Unlintable: linttest.TypeError},
		{Name: "max_bundle_bytes low", Set: "max_bundle_bytes: 65535", Refused: "max_bundle_bytes:", Lint: "max_bundle_bytes must be between 65536 and 67108864"},
		{Name: "max_bundle_bytes high", Set: "max_bundle_bytes: 67108865", Refused: "max_bundle_bytes:", Lint: "max_bundle_bytes must be between"},
		{Name: "envelope", Set: "envelopes: [{queue: q}, {queue: published, partition: p1, max_events: 1, max_bytes: 65536}]"},
		{Name: "envelope queue empty", Set: "envelopes: [{queue: ''}]", Refused: "envelopes[0].queue:", Lint: "envelopes[].queue must be 1-128 bytes"},
		{Name: "envelope queue with a brace", Set: "envelopes: [{queue: 'a}'}]", Refused: "envelopes[0].queue:", Lint: "envelopes[].queue must be 1-128 bytes"},
		{Name: "envelope queue twice", Set: "envelopes: [{queue: q}, {queue: q}]", Refused: "envelopes[1].queue:", Lint: "envelopes must not list a queue twice"},
		{Name: "envelope partition empty", Set: "envelopes: [{queue: q, partition: ''}]", Refused: "envelopes[0].partition:", Lint: "envelopes[].partition must be 1-128 bytes"},
		{Name: "envelope partition long", Set: "envelopes: [{queue: q, partition: " + strings.Repeat("p", 129) + "}]", Refused: "envelopes[0].partition:", Lint: "envelopes[].partition must be 1-128 bytes"},
		{Name: "envelope max_events low", Set: "envelopes: [{queue: q, max_events: 0}]", Refused: "envelopes[0].max_events:", Lint: "envelopes[].max_events must be between 1 and 1000000"},
		{Name: "envelope max_events high", Set: "envelopes: [{queue: q, max_events: 1000001}]", Refused: "envelopes[0].max_events:", Lint: "envelopes[].max_events must be between"},
		{Name: "envelope max_bytes low", Set: "envelopes: [{queue: q, max_bytes: 65535}]", Refused: "envelopes[0].max_bytes:", Lint: "envelopes[].max_bytes must be between 65536"},
		{Name: "envelope max_bytes over the bundle", Set: "envelopes: [{queue: q, max_bytes: 4194305}]", Refused: "envelopes[0].max_bytes:", Lint: "envelopes[].max_bytes must be at most max_bundle_bytes"},
		{Name: "envelope max_bytes within a larger bundle", Set: "{max_bundle_bytes: 8388608, envelopes: [{queue: q, max_bytes: 8388608}]}"},
		{Name: "envelope max_bytes over a smaller bundle", Set: "{max_bundle_bytes: 65536, envelopes: [{queue: q}]}", Refused: "envelopes[0].max_bytes:", Lint: "envelopes[].max_bytes must be at most max_bundle_bytes"},
		{Name: "chunk_rows low", Set: "chunk_rows: 0", Refused: "chunk_rows:", Lint: "chunk_rows must be between 1 and 100000"},
		{Name: "chunk_rows high", Set: "chunk_rows: 100001", Refused: "chunk_rows:", Lint: "chunk_rows must be between"},
		{Name: "cluster, queues in two slots", Set: "{redis: {cluster_urls: ['redis://127.0.0.1:7000']}, tables: [{table: a, queue: orders}, {table: b, queue: " + otherSlot + "}]}",
			Refused: "cluster_slot", Lint: "cluster_slot"},
		{Name: "cluster, two queues in one slot", Set: "{redis: {cluster_urls: ['redis://127.0.0.1:7000']}, tables: [{table: a, queue: orders}, {table: b, queue: " + sameSlot + "}]}"},
		{Name: "two slots without cluster", Set: "tables: [{table: a, queue: orders}, {table: b, queue: " + otherSlot + "}]"},
	}
	cases = append(cases, linttest.PGConnCases()...)
	cases = append(cases, linttest.RedisConnCases("redis")...)
	linttest.Check(t, linttest.Input, "pg_cdc", "name: orders\nhost: 127.0.0.1\ntables: [{table: t, queue: orders}]\n", start, cases)
}

// TestRedisQueueInputLintRefusesWhatTheStartRefuses: the same for the redis_queue input.
func TestRedisQueueInputLintRefusesWhatTheStartRefuses(t *testing.T) {
	start := linttest.Start(RedisQueueSpec(), RedisQueueConfigFromParsed)
	cases := []linttest.Case{
		{Name: "valid", Set: "{}"},
		{Name: "empty queue", Set: "queue: ''", Refused: "bad_queue", Lint: "queue must be 1-256 bytes"},
		{Name: "long queue", Set: "queue: " + strings.Repeat("q", 257), Refused: "bad_queue", Lint: "queue must be 1-256 bytes"},
		{Name: "queue with a brace", Set: "queue: 'a}b'", Refused: "bad_queue", Lint: "queue must be 1-256 bytes"},
		{Name: "no queue", Set: "queue: ~", Refused: "queue", Lint: "queue is required"},
		{Name: "empty group", Set: "group: ''", Refused: "bad_group", Lint: "group must be non-empty"},
		{Name: "group with a colon", Set: "group: 'a:b'", Refused: "bad_group", Lint: "group must be non-empty"},
		{Name: "start_from", Set: "start_from: now", Refused: "bad_start_from", Lint: "not a valid option"},
		{Name: "block", Set: "block: soon", Refused: "block", Lint: "block must be a duration above 0s"},
		{Name: "lease_ttl", Set: "lease_ttl: 10", Refused: "lease_ttl", Lint: "lease_ttl must be a duration above 0s"},
		{Name: "batch_count text", Set: "batch_count: many", Refused: "batch_count", Unlintable: linttest.TypeError},
		{Name: "batch_count 0 is the default (lint asks for it)", Set: "batch_count: 0", Lint: "batch_count must be at least 1"},
	}
	cases = append(cases, linttest.RedisConnCases("")...)
	linttest.Check(t, linttest.Input, "redis_queue", "queue: orders\ngroup: orders_copy\n", start, cases)
}
