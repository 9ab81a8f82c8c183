package input

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/redpanda-data/benthos/v4/public/bloblang"
	"github.com/redpanda-data/benthos/v4/public/service"

	"github.com/pgrelay/pgrelay/internal/confread"
	"github.com/pgrelay/pgrelay/internal/partition"
	"github.com/pgrelay/pgrelay/internal/pgconnect"
	"github.com/pgrelay/pgrelay/internal/queue"
	"github.com/pgrelay/pgrelay/internal/redisconn"
	"github.com/pgrelay/pgrelay/internal/source"
	"github.com/pgrelay/pgrelay/internal/speclint"
)

// Field names of the pg_cdc input (the connection fields are pgconnect's, under redis: redisconn's).
const (
	pcFieldName              = "name"
	pcFieldTables            = "tables"
	pcFieldTable             = "table"
	pcFieldQueue             = "queue"
	pcFieldPartitionBy       = "partition_by"
	pcFieldAppendOnly        = "append_only"
	pcFieldColumns           = "columns"
	pcFieldExclude           = "exclude"
	pcFieldOnRefusedTable    = "on_refused_table"
	pcFieldPublication       = "publication"
	pcFieldPublicationName   = "name"
	pcFieldPublicationManage = "manage"
	pcFieldPublishFunction   = "publish_function"
	pcFieldSlot              = "slot"
	pcFieldSlotName          = "name"
	pcFieldSlotFailover      = "failover"
	pcFieldRedis             = "redis"
	pcFieldLeaseTTL          = "lease_ttl"
	pcFieldMaxBundleMessages = "max_bundle_messages"
	pcFieldMaxBundleBytes    = "max_bundle_bytes"
	pcFieldLinger            = "linger"
	pcFieldLoadLinger        = "load_linger"
	pcFieldHeartbeat         = "heartbeat"
	pcFieldTruncate          = "truncate"
	pcFieldSnapshot          = "snapshot"
	pcFieldChunkRows         = "chunk_rows"
	pcFieldMetadata          = "metadata"
	pcFieldEnvelopes         = "envelopes"
	pcFieldEnvQueue          = "queue"
	pcFieldEnvPartition      = "partition"
	pcFieldEnvMaxEvents      = "max_events"
	pcFieldEnvMaxBytes       = "max_bytes"
)

// pcDefaultBundleBytes is max_bundle_bytes' default.
const pcDefaultBundleBytes = 4 << 20

// partition_by's and the enums' values.
const (
	pcPartitionKey, pcPartitionSingle = "key", "single"
	pcTruncateSkip, pcTruncateEmit    = "skip", "emit"
	pcSnapshotNever, pcSnapshotInit   = "never", "initial"
	pcRefusedSkip, pcRefusedStop      = "skip", "stop"
)

// PgCDCSpec is the pg_cdc input's config spec.
func PgCDCSpec() *service.ConfigSpec {
	tablePath := func(f string) string { return pcFieldTables + "[]." + f }
	envPath := func(f string) string { return pcFieldEnvelopes + "[]." + f }
	queueRule := func(path string) string { return speclint.QueueName(path, source.MaxQueueBytes, false) }
	// schema.name or name, without the SQL quotes pg_sink's table takes: names here are as written
	tableRule := func(path string) string {
		return fmt.Sprintf(`root = if this.contains("\"") { [%q + this.replace_all("\"", "")] } else if !this.re_match(%s) { [%q] }`,
			path+" is taken as written, without SQL quotes: use ", speclint.Quote(source.TablePattern), path+" must match "+source.TablePattern)
	}
	return service.NewConfigSpec().
		Beta().
		Version("0.1.0").
		Categories("Services").
		Summary("Streams committed PostgreSQL changes (logical replication, pgoutput) into pgrelay's Redis Streams queue, exactly once with the `redis_queue` output.").
		Description(`Each committed transaction becomes change events (one JSON object per message: op, table, key,
before, after, lsn, xid, ts) in commit order, one batch per transaction or several small ones; a large
transaction goes in pieces whose cover records how far in they got. Every replica runs the same config; one
owns the source through a lease in Redis, the others stand by.

With the `+"`redis_queue`"+` output the messages and the source's pointer are written in one atomic script:
exactly once. With any other output pg_cdc writes the pointer itself after the ack: at-least-once (a crash
between the output's write and the pointer write repeats the batch). PostgreSQL is told a position only after
the pointer holds it.

Metadata on every message (unless `+"`metadata: false`"+`): `+"`queue`, `partition`, `message_id`, `transaction_id`, `op`, `table`, `lsn`"+`,
`+"`created_at`"+` (the transaction's `+"`xid`"+` is in the event). The batch's lease, fence and cover travel in the messages' context, where the
`+"`redis_queue`"+` output reads them. Keep a batch whole on its way there (no output `+"`batching`"+`).`).
		Fields(pgconnect.Fields()...).
		Fields(
			service.NewStringField(pcFieldName).Description("The connector's name; the slot and publication default to `pgrelay_<name>` (`-` becomes `_`), and the lease and pointer keys carry it.").
				Example("orders").LintRule(speclint.Match(pcFieldName, source.NamePattern, false)),
			service.NewObjectListField(pcFieldTables,
				service.NewStringField(pcFieldTable).Description("`schema.name`, or `name` in schema public. Taken as written, case-sensitive and without SQL quotes: a table created as `CREATE TABLE \"Orders\"` is `public.Orders`, one created as `CREATE TABLE Orders` is `public.orders`. An ordinary or a partitioned table: a partitioned one is streamed as one table, its partitions' changes (of partitions created later too) as its own. A `*` is a pattern (`sales.*`, `public.order_*`, `tenant_*.orders`): every table it matches, with this entry's options, tables created later too (a `*` in the schema never matches `pg_*`, `information_schema` or `pgrelay`) (the source restarts its session within half a heartbeat to publish and, with `snapshot: initial`, read them); an entry naming a table outright wins over a pattern, and partitions are never matched.").
					LintRule(tableRule(tablePath(pcFieldTable))),
				service.NewStringField(pcFieldQueue).Description(fmt.Sprintf("The queue its changes go to (1-%d bytes, no braces).", source.MaxQueueBytes)).
					LintRule(queueRule(tablePath(pcFieldQueue))),
				service.NewAnyField(pcFieldPartitionBy).Description("`key` (the key columns, default), `single` (one partition `all`, total order), or a list of columns (inside the key, unless the table has REPLICA IDENTITY FULL or is append-only). An append-only table without a key needs `single` or columns.").Default(pcPartitionKey).
					LintRule(fmt.Sprintf(`root = if this.type() == "string" { if ![%q, %q].contains(this) { [%q] } } else if this.type() == "array" { if this.length() == 0 || this.any(c -> c.type() != "string" || c == "") { [%q] } } else { [%q] }`,
						pcPartitionKey, pcPartitionSingle, tablePath(pcFieldPartitionBy)+" must be key, single or a list of columns",
						tablePath(pcFieldPartitionBy)+" must list at least one column, each a non-empty string",
						tablePath(pcFieldPartitionBy)+" must be key, single or a list of columns")),
				service.NewBoolField(pcFieldAppendOnly).Description("The table only gets inserts (a log or event table): stream its inserts only. It is published by a second, insert-only publication, so it needs no key (a table without one has `key: null` in its events and needs `partition_by: single` or columns), its updates and deletes run without a replica identity and are not streamed, and `snapshot: initial` does not copy the rows of one without a key.").
					Default(false),
				service.NewStringListField(pcFieldColumns).Description("Stream and snapshot only these columns of the table (default: all). pg_cdc publishes the table with them as its publication column list, so the other columns' values never leave PostgreSQL: not in the WAL stream, the snapshot or the read-back of unchanged values, and the role needs SELECT on these columns only. The list must hold the key columns (and the `partition_by` columns); it needs PostgreSQL 15 or newer, and a table with REPLICA IDENTITY FULL must be append-only. Events hold the listed columns in table order; a column added to the table later is not streamed until listed.").
					Default([]any{}).Example([]string{"id", "status", "total"}).
					LintRule(fmt.Sprintf(`root = if this.type() == "array" && (this.any(c -> c == "") || this.unique().length() != this.length()) { [%q] }`,
						tablePath(pcFieldColumns)+" must list each column once, by a non-empty name")),
				service.NewStringListField(pcFieldExclude).Description("For a pattern entry: tables it matches that are not streamed, named as `table` names them (`schema.name` or `name`, a `*` for any characters), e.g. `[public.audit_*, public.tmp, tenant_test.*]`.").
					Default([]any{}).Example([]string{"public.audit_*"}),
			).Description(fmt.Sprintf("The tables to stream (1-%d, none twice), in order; the lease and pointer live under the first one's queue.", source.MaxTables)).
				LintRule(fmt.Sprintf(`root = if this.type() != "array" { deleted() } else if this.length() < 1 || this.length() > %d { [%q] } else if this.map_each(t -> if t.%s.or("").contains(".") { t.%s } else { "public." + t.%s.or("") }).unique().length() != this.length() { [%q] }`,
					source.MaxTables, fmt.Sprintf("%s must list 1-%d tables", pcFieldTables, source.MaxTables),
					pcFieldTable, pcFieldTable, pcFieldTable, pcFieldTables+" must not list a table twice (name is public.name)")),
			service.NewObjectListField(pcFieldEnvelopes,
				service.NewStringField(pcFieldEnvQueue).Description("The queue: a queue of `tables`, or one that only `pgrelay.publish()` writes to.").
					LintRule(queueRule(envPath(pcFieldEnvQueue))),
				service.NewStringField(pcFieldEnvPartition).Description(fmt.Sprintf("The partition of every envelope of the queue (1-%d bytes). One partition keeps the transactions in commit order.", partition.MaxLen)).
					Default(partition.Single).
					LintRule(fmt.Sprintf(`root = if this.length() < 1 || this.length() > %d { [%q] }`, partition.MaxLen,
						fmt.Sprintf("%s must be 1-%d bytes", envPath(pcFieldEnvPartition), partition.MaxLen))),
				service.NewIntField(pcFieldEnvMaxEvents).Description(fmt.Sprintf("Most change events in one envelope (%d-%d): a transaction with more for the queue goes in parts.", source.MinEnvelopeEvents, source.MaxEnvelopeEvs)).
					Default(source.DefaultEnvelopeEvents).
					LintRule(speclint.Int(envPath(pcFieldEnvMaxEvents), source.MinEnvelopeEvents, source.MaxEnvelopeEvs)),
				service.NewIntField(pcFieldEnvMaxBytes).Description(fmt.Sprintf("Most bytes of one envelope (%d up to `%s`, whose limit is %d): a transaction with more for the queue goes in parts.", source.MinEnvelopeBytes, pcFieldMaxBundleBytes, source.MaxBundleBytes)).
					Default(source.DefaultEnvelopeBytes).
					LintRule(speclint.Int(envPath(pcFieldEnvMaxBytes), source.MinEnvelopeBytes, source.MaxBundleBytes)),
			).Description(`Queues that get one message per transaction: an envelope `+"`"+`{"op":"x","id","lsn","xid","ts","part","last","events":[...]}`+"`"+` holding, in order, the transaction's change events for that queue (its tables' changes and the `+"`pgrelay.publish()`"+` messages sent to it), in one partition. A transaction over `+"`max_events`"+` or `+"`max_bytes`"+` goes in parts 1, 2, ... each written exactly once, the last with `+"`last: true`"+`. Snapshot chunks of the queue's tables come the same way, one envelope per part of a chunk. Events in an envelope are not partitioned: a key change is one `+"`u`"+` whose `+"`before`"+` holds the old key, whatever `+"`partition_by`"+` says.`).
				Default([]any{}).
				LintRule(fmt.Sprintf(`root = if this.type() == "array" && this.map_each(e -> e.%s.or("")).unique().length() != this.length() { [%q] }`,
					pcFieldEnvQueue, pcFieldEnvelopes+" must not list a queue twice")),
			service.NewObjectField(pcFieldPublication,
				service.NewStringField(pcFieldPublicationName).Description(fmt.Sprintf("Publication name; default `pgrelay_<name>` (`-` becomes `_`). With append-only tables at most %d bytes, their publication being `<name>%s`.", source.MaxPublicationBytes-len(source.InsertPublicationSuffix), source.InsertPublicationSuffix)).Default("").
					LintRule(fmt.Sprintf(`root = if this.length() > %d { [%q] }`, source.MaxPublicationBytes,
						fmt.Sprintf("%s.%s must be at most %d bytes", pcFieldPublication, pcFieldPublicationName, source.MaxPublicationBytes))),
				service.NewBoolField(pcFieldPublicationManage).Description("Create the publication, and correct it to exactly the tables (whole, every operation); with append-only tables also `<name>"+source.InsertPublicationSuffix+"`, exactly those tables, publishing insert and truncate. When false they are only checked: each configured table must be published (listed, or through FOR TABLES IN SCHEMA or FOR ALL TABLES) whole or with exactly its `columns`, without a row filter, with exactly those operations; other tables may be published too (their changes are sent and dropped), but never an append-only table in the main publication.").Default(true),
			).Description("The publication pgoutput reads (and, with append-only tables, the insert-only one named after it)."),
			service.NewStringEnumField(pcFieldOnRefusedTable, pcRefusedSkip, pcRefusedStop).Description("What a table the start checks refuse (missing, no usable key, bad partition_by) does to the source: `skip` streams the other tables and reports it (log, `pgrelay status`, the `pgrelay_source_table_refused` metric), checking it again at every start; `stop` stops the whole source with its coded error.").Default(pcRefusedSkip),
			service.NewBoolField(pcFieldPublishFunction).Description("At start, install `pgrelay.publish(queue text, partition text, payload jsonb)` (a transactional publish into the queue without an outbox table), in one transaction, when no function of that signature exists; an existing one is never replaced, whoever owns it. Without the privilege (CREATE on the database, SQLSTATE 42501) one `publish_function` warning is logged and the source streams on; any other error fails the start. `false`: install nothing.").Default(true),
			service.NewObjectField(pcFieldSlot,
				service.NewStringField(pcFieldSlotName).Description("Replication slot name; default `pgrelay_<name>`.").Default("").
					LintRule(speclint.Match(pcFieldSlot+"."+pcFieldSlotName, source.SlotPattern, true)),
				service.NewBoolField(pcFieldSlotFailover).Description("A failover slot (PostgreSQL 17+; older servers refuse the start with `version`): the slot is created so, and an existing slot's flag is changed to match at start (a `slot_failover` warning when that fails).").Default(false),
			).Description("The logical replication slot (created on the first start, never silently recreated)."),
			service.NewObjectField(pcFieldRedis, redisconn.Fields()...).Description("The Redis holding the lease and pointer (the same as the redis_queue output's), nested under `redis` so its `tls` does not clash with PostgreSQL's."),
			service.NewDurationField(pcFieldLeaseTTL).Description(fmt.Sprintf("Lease time to live (%s-%s); renewed every third of it, released at once on SIGTERM.", source.MinLeaseTTL, source.MaxLeaseTTL)).Default("10s").
				LintRule(speclint.Duration(pcFieldLeaseTTL, source.MinLeaseTTL, source.MaxLeaseTTL)),
			service.NewIntField(pcFieldMaxBundleMessages).Description(fmt.Sprintf("Most messages per batch (%d-%d); a larger transaction goes in pieces.", source.MinBundleMessages, source.MaxBundleMessages)).Default(1000).
				LintRule(speclint.Int(pcFieldMaxBundleMessages, source.MinBundleMessages, source.MaxBundleMessages)),
			service.NewIntField(pcFieldMaxBundleBytes).Description(fmt.Sprintf("Most payload bytes per batch (%d-%d).", source.MinBundleBytes, source.MaxBundleBytes)).Default(pcDefaultBundleBytes).
				LintRule(speclint.Int(pcFieldMaxBundleBytes, source.MinBundleBytes, source.MaxBundleBytes)),
			service.NewDurationField(pcFieldLinger).Description(fmt.Sprintf("How long a batch may wait for more transactions before it goes, whatever the load (0s-%s); 0 sends as soon as nothing more is buffered (unless `%s` holds it under load).", source.MaxLinger, pcFieldLoadLinger)).Default("0s").
				LintRule(speclint.Duration(pcFieldLinger, 0, source.MaxLinger)),
			service.NewDurationField(pcFieldLoadLinger).Description(fmt.Sprintf("Under sustained load, how long after the previous batch's acknowledgement a batch that is not full waits to fill (0s-%s; 0s: never). It waits only while events arrive fast enough that the wait is expected to bring at least %d more (the rate averaged over the last batches), or while the stream is behind the writers (catch-up batching: the newest transaction arrived more than %d times this long later after its commit than the quickest recent delivery, so more WAL is waiting in the server), so a trickle that is caught up goes at once; under load batches grow, and each event costs less CPU in pgrelay and Redis, for up to this much more latency. While the stream keeps up (no snapshot running, no linger) the WAL is read once per batch, shortly before it is due, and the batch goes as soon as that read is queued.", source.MaxLinger, source.FillMinEvents, source.BehindLingers)).Default(source.DefaultLoadLinger.String()).
				LintRule(speclint.Duration(pcFieldLoadLinger, 0, source.MaxLinger)),
			service.NewDurationField(pcFieldHeartbeat).Description(fmt.Sprintf("With no WAL data for this long, emit a heartbeat message so an idle source still advances (%s-%s). Every half of it the owner also checks that each table is still in its publication (a table taken out ends the session with `publication`, and the next start puts it back and, with `snapshot: initial`, reads it again).", source.MinHeartbeat, source.MaxHeartbeat)).Default("10s").
				LintRule(speclint.Duration(pcFieldHeartbeat, source.MinHeartbeat, source.MaxHeartbeat)),
			service.NewStringEnumField(pcFieldTruncate, pcTruncateSkip, pcTruncateEmit).Description("`skip` (counted, logged) or `emit` a `t` event to partition `all` (needs partition_by: single on every table).").Default(pcTruncateSkip),
			service.NewStringEnumField(pcFieldSnapshot, pcSnapshotNever, pcSnapshotInit).Description("`never`: stream from the slot's creation. `initial`: on the first start (and after `pgrelay resync`) also copy the rows already in the tables, as `r` events, chunk by chunk while the stream runs. Opt-in, so adding pg_cdc to a big database never starts a copy by surprise; a resync always snapshots.").Default(pcSnapshotNever),
			service.NewIntField(pcFieldChunkRows).Description(fmt.Sprintf("Most rows per snapshot chunk (%d-%d): each chunk is one short REPEATABLE READ read between two watermarks, and costs a round trip and two watermarks whatever its size. A table's first chunk after pg_cdc starts reads at most %d rows; later ones read fewer when the table's rows are wide, about %d MiB of values a chunk, so a table of large documents is read in chunks that stay small in memory.", source.MinChunkRows, source.MaxChunkRows, source.FirstChunkRows, source.ChunkValueBytes>>20)).Default(source.DefaultChunkRows).
				LintRule(speclint.Int(pcFieldChunkRows, source.MinChunkRows, source.MaxChunkRows)),
			service.NewBoolField(pcFieldMetadata).Description("Set the eight metadata keys on every message. `false` sets none, for a pipeline where nothing after pg_cdc reads them, such as straight into `redis_queue`: that output then takes each message's queue, partition, id and transaction from pg_cdc's batch, by the message's place in it, and each message saves its metadata map (about a tenth of pgrelay's CPU per change into the queue). The messages must then reach `redis_queue` one for one and in order: a processor may change their payloads, or set `queue`, `partition`, `message_id` or `transaction_id` metadata (which the output prefers), but a batch of another size is refused with `batch_reshaped`, and other outputs, processors and interpolations see no pg_cdc metadata.").
				Default(true),
		).
		LintRule(speclint.Rule(slices.Concat(pgconnect.LintChecks(), speclint.RedisURLChecks(pcFieldRedis), []string{
			speclint.Check(fmt.Sprintf(`this.%s.or(%q) == %q && this.%s.or([]).any(t -> t.%s.or(%q) != %q)`,
				pcFieldTruncate, pcTruncateSkip, pcTruncateEmit, pcFieldTables, pcFieldPartitionBy, pcPartitionKey, pcPartitionSingle),
				pcFieldTruncate+": emit needs partition_by: single on every table (a truncate has no key)"),
			speclint.Check(fmt.Sprintf(`this.%s.%s.or([]).length() > 0 && this.%s.or([]).map_each(t -> t.%s.or("").redis_cluster_slot()).unique().length() > 1`,
				pcFieldRedis, redisconn.FieldClusterURLs, pcFieldTables, pcFieldQueue),
				"on Redis Cluster every queue of one source must hash to the same slot (cluster_slot): give its tables the same queue"),
			speclint.Check(fmt.Sprintf(`this.%s.or([]).any(t -> t.%s.or(false)) && this.%s.%s.or("").length() > %d`,
				pcFieldTables, pcFieldAppendOnly, pcFieldPublication, pcFieldPublicationName, source.MaxPublicationBytes-len(source.InsertPublicationSuffix)),
				fmt.Sprintf("%s.%s must be at most %d bytes with append-only tables (their publication adds %q)",
					pcFieldPublication, pcFieldPublicationName, source.MaxPublicationBytes-len(source.InsertPublicationSuffix), source.InsertPublicationSuffix)),
			speclint.Check(fmt.Sprintf(`this.%s.or([]).any(t -> t.%s.or([]).length() > 0 && !t.%s.or("").contains("*"))`, pcFieldTables, pcFieldExclude, pcFieldTable),
				tablePath(pcFieldExclude)+" is for an entry whose table is a pattern"),
			speclint.Check(fmt.Sprintf(`this.%s.or([]).any(t -> t.%s.or([]).any(x -> x.type() != "string" || x == "" || x.contains("\"") || x.has_prefix(".") || x.has_suffix(".")))`, pcFieldTables, pcFieldExclude),
				tablePath(pcFieldExclude)+" must name tables as table takes them (schema.name or name, a * for any characters, no SQL quotes)"),
			speclint.Check(fmt.Sprintf(`this.%s.or([]).any(t -> t.%s.or("").contains("*") && (t.%s.or([]).length() > 0 || t.%s.or(%q).type() == "array"))`,
				pcFieldTables, pcFieldTable, pcFieldColumns, pcFieldPartitionBy, pcPartitionKey),
				tablePath(pcFieldTable)+" is a pattern: its tables share the entry's options, so columns and partition_by columns are for tables listed by name"),
			speclint.Check(fmt.Sprintf(`this.%s.or([]).any(e -> e.%s.or(%d) > this.%s.or(%d))`,
				pcFieldEnvelopes, pcFieldEnvMaxBytes, source.DefaultEnvelopeBytes, pcFieldMaxBundleBytes, pcDefaultBundleBytes),
				fmt.Sprintf("%s[].%s must be at most %s (an envelope goes whole in one batch): raise both for larger envelopes", pcFieldEnvelopes, pcFieldEnvMaxBytes, pcFieldMaxBundleBytes)),
		})...)).
		Example("Orders into a queue", "Streams every committed change of public.orders into the queue `orders`, exactly once with the `redis_queue` output, copying the rows already there first. Run two or more copies for high availability: one owns the source, the others stand by.", `
input:
  pg_cdc:
    name: orders
    dsn: ${PG_DSN:postgres://pgrelay@127.0.0.1:5432/app}
    password: ${PGPASSWORD:}
    tables:
      - table: public.orders
        queue: orders
    redis:
      url: ${REDIS_URL:redis://127.0.0.1:6379}
    snapshot: initial
output:
  redis_queue:
    url: ${REDIS_URL:redis://127.0.0.1:6379}
    durability: aof
`).
		Example("Several tables, one total order", "Every table in one partition (`single`), so a consumer sees the changes in exactly the commit order; a TRUNCATE is emitted as a `t` event.", `
input:
  pg_cdc:
    name: ledger
    host: 127.0.0.1
    user: pgrelay
    password: ${PGPASSWORD}
    database: bank
    tables:
      - { table: accounts, queue: ledger, partition_by: single }
      - { table: transfers, queue: ledger, partition_by: single }
    truncate: emit
    redis:
      url: ${REDIS_URL:redis://127.0.0.1:6379}
output:
  redis_queue:
    url: ${REDIS_URL:redis://127.0.0.1:6379}
`).
		Example("One message per transaction", "An order, its items and the events the application publishes with `pgrelay.publish('shop', ...)` in the same transaction arrive as one envelope in the queue `shop` (partition `all`, so in commit order); a transaction with more than 5,000 of them goes in numbered parts. The audit table's changes go one per message to their own queue.", `
input:
  pg_cdc:
    name: shop
    dsn: ${PG_DSN:postgres://pgrelay@127.0.0.1:5432/shop}
    password: ${PGPASSWORD:}
    tables:
      - { table: orders, queue: shop }
      - { table: order_items, queue: shop }
      - { table: audit_log, queue: audit }
    envelopes:
      - { queue: shop, max_events: 5000 }
    redis:
      url: ${REDIS_URL:redis://127.0.0.1:6379}
output:
  redis_queue:
    url: ${REDIS_URL:redis://127.0.0.1:6379}
    durability: aof
`).
		Example("A log table without a key", "pgbench's tables: the three with a primary key stream every change; `pgbench_history` has no key and only gets inserts, so it is append-only (in the insert-only publication `pgrelay_bench_insert`, events with `key: null`), partitioned by teller. A table the start checks refuse is skipped and reported while the others stream (`on_refused_table: skip`, the default).", `
input:
  pg_cdc:
    name: bench
    dsn: ${PG_DSN:postgres://pgrelay@127.0.0.1:5432/bench}
    password: ${PGPASSWORD:}
    tables:
      - { table: pgbench_accounts, queue: accounts }
      - { table: pgbench_branches, queue: branches }
      - { table: pgbench_tellers, queue: tellers }
      - { table: pgbench_history, queue: history, append_only: true, partition_by: [tid] }
    redis:
      url: ${REDIS_URL:redis://127.0.0.1:6379}
output:
  redis_queue:
    url: ${REDIS_URL:redis://127.0.0.1:6379}
    durability: aof
`)
}

func init() {
	// Used by pg_cdc's lint rule, so it is registered before the spec is built.
	bloblang.MustRegisterMethodV2("redis_cluster_slot",
		bloblang.NewPluginSpec().Category("String Manipulation").
			Description("The Redis Cluster hash slot (0-16383) of a key: CRC16 of its hash tag (the part between the first `{` and the next `}`, when not empty), else of the whole key, mod 16384.").
			Example("", `root = this.key.redis_cluster_slot()`, [2]string{`{"key":"pgrelay:{orders}:s:0"}`, `105`}),
		func(*bloblang.ParsedParams) (bloblang.Method, error) {
			return bloblang.StringMethod(func(s string) (any, error) { return int64(source.ClusterSlot(s)), nil }), nil
		})
	service.MustRegisterBatchInput("pg_cdc", PgCDCSpec(), newPgCDC)
}

// PgCDCConfigFromParsed reads a pg_cdc section parsed with PgCDCSpec into source.Config and validates it;
// errors start with the field's path.
func PgCDCConfigFromParsed(conf *service.ParsedConfig) (source.Config, error) {
	var c source.Config
	var err error
	c.Name, _ = conf.FieldString(pcFieldName) // a missing name is Validate's error, which names the fix
	if c.PG, err = pgconnect.Parse(conf); err != nil {
		return c, err
	}
	r := confread.New(conf)
	c.Publication = r.String(pcFieldPublication, pcFieldPublicationName)
	c.ManagePublication = r.Bool(pcFieldPublication, pcFieldPublicationManage)
	c.PublishFunction = r.Bool(pcFieldPublishFunction)
	c.Slot = r.String(pcFieldSlot, pcFieldSlotName)
	c.SlotFailover = r.Bool(pcFieldSlot, pcFieldSlotFailover)
	c.LeaseTTL = r.Duration(pcFieldLeaseTTL)
	c.MaxBundleMessages = r.Int(pcFieldMaxBundleMessages)
	c.MaxBundleBytes = r.Int(pcFieldMaxBundleBytes)
	c.Linger = r.Duration(pcFieldLinger)
	c.LoadLinger = r.Duration(pcFieldLoadLinger)
	c.Heartbeat = r.Duration(pcFieldHeartbeat)
	c.ChunkRows = r.Int(pcFieldChunkRows)
	truncate, snapshot, refused := r.String(pcFieldTruncate), r.String(pcFieldSnapshot), r.String(pcFieldOnRefusedTable)
	if err := r.Err(); err != nil {
		return c, err
	}
	switch refused {
	case pcRefusedSkip, pcRefusedStop:
		c.StopOnRefusedTable = refused == pcRefusedStop
	default:
		return c, fmt.Errorf("%s: %q is not %s or %s", pcFieldOnRefusedTable, refused, pcRefusedSkip, pcRefusedStop)
	}
	switch truncate {
	case pcTruncateSkip, pcTruncateEmit:
		c.TruncateEmit = truncate == pcTruncateEmit
	default:
		return c, fmt.Errorf("%s: %q is not %s or %s", pcFieldTruncate, truncate, pcTruncateSkip, pcTruncateEmit)
	}
	switch snapshot {
	case pcSnapshotNever, pcSnapshotInit:
		c.SnapshotInitial = snapshot == pcSnapshotInit
	default:
		return c, fmt.Errorf("%s: %q is not %s or %s", pcFieldSnapshot, snapshot, pcSnapshotInit, pcSnapshotNever)
	}
	if c.Redis, err = redisconn.Parse(conf.Namespace(pcFieldRedis)); err != nil {
		return c, fmt.Errorf("%s: %w", pcFieldRedis, err)
	}
	if c.Tables, err = pgCDCTables(r); err != nil {
		return c, err
	}
	if c.Envelopes, err = pgCDCEnvelopes(r); err != nil {
		return c, err
	}
	return c, c.Validate()
}

// pgCDCTables reads the tables list.
func pgCDCTables(r *confread.Reader) ([]source.Table, error) {
	items := r.Objects(pcFieldTables)
	if err := r.Err(); err != nil {
		return nil, err
	}
	out := make([]source.Table, 0, len(items))
	for _, tr := range items {
		var t source.Table
		name := tr.String(pcFieldTable)
		t.Queue = tr.String(pcFieldQueue)
		t.AppendOnly = tr.Bool(pcFieldAppendOnly)
		t.ColumnList = tr.StringList(pcFieldColumns)
		t.Exclude = tr.StringList(pcFieldExclude)
		pb := tr.Any(pcFieldPartitionBy)
		if err := tr.Err(); err != nil {
			return nil, err
		}
		t.Schema, t.Name = source.ParseTable(name)
		path := tr.Path(pcFieldPartitionBy)
		switch v := pb.(type) {
		case string:
			switch v {
			case pcPartitionKey:
				t.Mode = source.PartitionByKey
			case pcPartitionSingle:
				t.Mode = source.PartitionBySingle
			default:
				return nil, fmt.Errorf("%s: %q is not %s, %s or a list of columns", path, v, pcPartitionKey, pcPartitionSingle)
			}
		case []any:
			t.Mode = source.PartitionByColumns
			for _, c := range v {
				s, ok := c.(string)
				if !ok || s == "" {
					return nil, fmt.Errorf("%s: columns must be non-empty strings", path)
				}
				t.Columns = append(t.Columns, s)
			}
		default:
			return nil, fmt.Errorf("%s: use %s, %s or a list of columns", path, pcPartitionKey, pcPartitionSingle)
		}
		out = append(out, t)
	}
	return out, nil
}

// pgCDCEnvelopes reads the envelopes list.
func pgCDCEnvelopes(r *confread.Reader) ([]source.EnvelopeQueue, error) {
	items := r.Objects(pcFieldEnvelopes)
	if err := r.Err(); err != nil {
		return nil, err
	}
	out := make([]source.EnvelopeQueue, 0, len(items))
	for _, er := range items {
		e := source.EnvelopeQueue{
			Queue:     er.String(pcFieldEnvQueue),
			Partition: er.String(pcFieldEnvPartition),
			MaxEvents: er.Int(pcFieldEnvMaxEvents),
			MaxBytes:  er.Int(pcFieldEnvMaxBytes),
		}
		if err := er.Err(); err != nil {
			return nil, err
		}
		out = append(out, e)
	}
	return out, nil
}

//------------------------------------------------------------------------------

func newPgCDC(conf *service.ParsedConfig, mgr *service.Resources) (service.BatchInput, error) {
	cfg, err := PgCDCConfigFromParsed(conf)
	if err != nil {
		return nil, err
	}
	redisconn.LogTo(mgr.Logger())
	src, err := source.New(cfg, mgr.Logger(), hooks(mgr, cfg.Name))
	if err != nil {
		return nil, err
	}
	meta, err := conf.FieldBool(pcFieldMetadata)
	if err != nil {
		return nil, err
	}
	p := &pgCDC{src: src, base: tracingBase(context.Background(), mgr.OtelTracer()), meta: meta}
	p.prepare = func(b *source.Batch) { b.Out = toMessages(p.base, b, p.meta) }
	return p, nil
}

// sourcePhases are the phases pgrelay_source_phase reports, one series each (docs/metrics.md).
var sourcePhases = []string{source.PhaseConnecting, source.PhaseStandby, source.PhaseWaitingForSlot,
	source.PhaseSnapshot, source.PhaseStreaming, source.PhaseError, source.PhaseStopped}

// hooks turns the source's events into metrics, each labelled with the source's name.
func hooks(mgr *service.Resources, name string) source.Hooks {
	m := mgr.Metrics()
	txns := m.NewCounter("pgrelay_source_transactions", "source")
	lag := m.NewGauge("pgrelay_source_slot_lag_bytes", "source")
	msgs := m.NewCounter("pgrelay_source_messages", "source")
	bundles := m.NewCounter("pgrelay_source_bundles", "source")
	ptr := m.NewGauge("pgrelay_source_pointer_lsn", "source")
	owner := m.NewGauge("pgrelay_source_owner", "source")
	errs := m.NewCounter("pgrelay_source_errors", "source", "code")
	snapRows := m.NewCounter("pgrelay_source_snapshot_rows", "source")
	snapTables := m.NewCounter("pgrelay_source_snapshot_tables", "source")
	phase := m.NewGauge("pgrelay_source_phase", "source", "phase")
	refused := m.NewGauge("pgrelay_source_table_refused", "source", "table", "code")
	return source.Hooks{
		Transactions: func(n int64) { txns.Incr(n, name) },
		SlotLag:      func(n int64) { lag.Set(n, name) },
		Messages:     func(n int64) { msgs.Incr(n, name) },
		Bundles:      func(n int64) { bundles.Incr(n, name) },
		PointerLSN:   func(lsn uint64) { ptr.Set(int64(lsn), name) },
		Owner: func(o bool) {
			if o {
				owner.Set(1, name)
			} else {
				owner.Set(0, name)
			}
		},
		Error: func(code string) {
			if code == "" {
				code = "transient"
			}
			errs.Incr(1, name, code)
		},
		Phase: func(p string) {
			for _, q := range sourcePhases {
				if q == p {
					phase.Set(1, name, q)
				} else {
					phase.Set(0, name, q)
				}
			}
		},
		SnapshotRows:   func(n int64) { snapRows.Incr(n, name) },
		SnapshotTables: func(n int64) { snapTables.Incr(n, name) },
		Refused: func(table, code string, yes bool) {
			if yes {
				refused.Set(1, name, table, code)
			} else {
				refused.Set(0, name, table, code)
			}
		},
	}
}

// pgCDC is the Benthos shell over source.Source.
type pgCDC struct {
	src  *source.Source
	once sync.Once
	// base is the context of every message (tracingBase), under the batch's own value
	base context.Context
	// prepare converts a batch Next built ahead, while the previous batch is in flight
	prepare func(*source.Batch)
	meta    bool // metadata: set the metadata keys on every message
}

// Connect starts the source and returns once it streams, snapshots or stands by for another
// replica, so Benthos' /ready answers 503 until then, and again after ReadBatch reported the source
// failed (source.ErrNotReady). While it cannot (PostgreSQL or Redis does not answer, a start check
// fails) it returns the source's last error every connectReport, which Benthos logs before it
// calls Connect again; the source keeps retrying on its own meanwhile.
func (p *pgCDC) Connect(ctx context.Context) error {
	p.once.Do(p.src.Start)
	return p.src.WaitReady(ctx, connectReport)
}

// connectReport is how long pg_cdc's and redis_queue's Connect wait for a replica that is not ready
// before they return why (Benthos logs it and calls Connect again).
const connectReport = 30 * time.Second

func (p *pgCDC) ReadBatch(ctx context.Context) (service.MessageBatch, service.AckFunc, error) {
	b, err := p.src.Next(ctx, p.prepare)
	if err != nil {
		if ctx.Err() != nil {
			return nil, nil, ctx.Err()
		}
		if errors.Is(err, source.ErrNotReady) {
			return nil, nil, service.ErrNotConnected // Connect waits for the source to stream again
		}
		return nil, nil, err
	}
	batch, ok := b.Out.(service.MessageBatch)
	b.Out = nil // a re-send after a nack gets fresh messages
	if !ok {
		batch = toMessages(p.base, b, p.meta)
	}
	return batch, func(ctx context.Context, err error) error {
		return p.src.Ack(ctx, b, err)
	}, nil
}

// toMessages turns a source batch into Benthos messages (docs/batch-contract.md). The batch's cover
// and receipt travel in the context of a template (base with the batch added), which every message
// shares as a copy of it: one value for the batch, where metadata would cost map entries on every
// message. The template has no
// metadata: a copy of a template's metadata clones its map by iteration, which costs more than
// filling a new one. Values repeated from the previous message (queue, transaction, op, table,
// lsn...) reuse its boxed value instead of allocating one each. Eight keys at most: a Go map of up to
// eight entries is one allocated group, and a ninth key makes it grow into a table (three more
// allocations and a rehash on every message). Without meta the messages carry no metadata and the
// batch in their context gives the redis_queue output their keys.
func toMessages(base context.Context, b *source.Batch, meta bool) service.MessageBatch {
	tmpl := service.NewMessage(nil).WithContext(queue.WithSourceBatch(base, b.ForQueue(!meta)))
	batch := make(service.MessageBatch, len(b.Events))
	if !meta {
		for i := range b.Events {
			m := tmpl.Copy()
			m.SetBytes(b.Events[i].Payload)
			batch[i] = m
		}
		return batch
	}
	var queueV, txV, opV, tableV, lsnV repeated
	var created any
	for i := range b.Events {
		e := &b.Events[i]
		if i == 0 || e.CreatedMs != b.Events[i-1].CreatedMs {
			created = strconv.FormatInt(e.CreatedMs, 10)
		}
		m := tmpl.Copy()
		m.SetBytes(e.Payload)
		m.MetaSetMut("queue", queueV.box(e.Queue))
		m.MetaSetMut("partition", e.Partition)
		m.MetaSetMut("message_id", e.ID)
		m.MetaSetMut("transaction_id", txV.box(e.Tx))
		m.MetaSetMut("op", opV.box(e.Op))
		m.MetaSetMut("table", tableV.box(e.Table))
		m.MetaSetMut("lsn", lsnV.box(e.LSN))
		m.MetaSetMut("created_at", created)
		batch[i] = m
	}
	return batch
}

// repeated boxes a string as a metadata value once for a run of equal values.
type repeated struct {
	s   string
	v   any
	set bool
}

func (r *repeated) box(s string) any {
	if !r.set || s != r.s {
		r.s, r.v, r.set = s, s, true
	}
	return r.v
}

func (p *pgCDC) Close(ctx context.Context) error {
	if err := p.src.Close(ctx); err != nil {
		return fmt.Errorf("pg_cdc close: %w", err)
	}
	return nil
}
