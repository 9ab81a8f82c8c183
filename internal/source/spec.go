package source

import (
	"fmt"
	"time"

	"github.com/redpanda-data/benthos/v4/public/service"

	"github.com/pgrelay/pgrelay/internal/pgconnect"
	"github.com/pgrelay/pgrelay/internal/redisconn"
)

// Spec is the pg_cdc input's config spec (shared by the plugin and the CLI subcommands).
func Spec() *service.ConfigSpec {
	return service.NewConfigSpec().
		Beta().
		Categories("Services").
		Summary("Streams committed PostgreSQL changes (logical replication, pgoutput) into pgrelay's Redis Streams queue, exactly once with the `redis_queue` output.").
		Description(`Each committed transaction becomes change events (one JSON object per message, DESIGN §2) in commit order,
one batch per transaction or several small ones; a large transaction goes in pieces whose cover records how far in
they got. Every replica runs the same config; one owns the source through a lease in Redis, the others stand by.

With the `+"`redis_queue`"+` output the messages and the pointer are written in one atomic script: exactly once.
With any other output pg_cdc writes the pointer itself after the ack: at-least-once (a crash between the output's
write and the pointer write repeats the batch). PostgreSQL is told a position only after the pointer holds it.

Metadata on every message: `+"`queue`, `partition`, `message_id`, `transaction_id`, `op`, `table`, `lsn`, `xid`"+`,
and the batch's `+"`pgrelay_lease_key`, `pgrelay_fence`, `pgrelay_pointer_key`, `pgrelay_cover`"+` (docs/batch-contract.md).
See docs/source.md.`).
		Fields(pgconnect.Fields()...).
		Fields(
			service.NewStringField("name").Description("The connector's name; the slot and publication default to `pgrelay_<name>` (`-` becomes `_`), and the lease and pointer keys carry it.").
				Example("orders").LintRule(`root = if !this.re_match("^[a-z0-9][a-z0-9_-]{0,47}$") { ["name must match ^[a-z0-9][a-z0-9_-]{0,47}$"] }`),
			service.NewObjectListField("tables",
				service.NewStringField("table").Description("`schema.name`, or `name` in schema public."),
				service.NewStringField("queue").Description("The queue its changes go to (≤128 bytes, no braces)."),
				service.NewAnyField("partition_by").Description("`key` (the key columns, default), `single` (one partition `all`, total order), or a list of columns.").Default("key"),
			).Description("The tables to stream, in order; the lease and pointer live under the first one's queue."),
			service.NewObjectField("publication",
				service.NewStringField("name").Description("Publication name; default `pgrelay_<name>`.").Default(""),
				service.NewBoolField("manage").Description("Create the publication, and correct it to exactly the tables (whole, every operation). When false it is only checked.").Default(true),
			).Description("The publication pgoutput reads."),
			service.NewBoolField("publish_function").Description("At start, install `pgrelay.publish(queue, partition, payload)` (resources/source_publish.sql, DESIGN §9) when no function of that signature exists; an existing one is never replaced. Without the privilege (CREATE on the database) a `publish_function` warning is logged and the source streams on.").Default(true),
			service.NewObjectField("slot",
				service.NewStringField("name").Description("Replication slot name; default `pgrelay_<name>`.").Default(""),
				service.NewBoolField("failover").Description("Create a failover slot (PostgreSQL 17+).").Default(false),
			).Description("The logical replication slot (created on the first start, never silently recreated)."),
			service.NewObjectField("redis", redisconn.Fields()...).Description("The Redis holding the lease and pointer (the same as the redis_queue output's)."),
			service.NewDurationField("lease_ttl").Description("Lease time to live (3s-120s); renewed every third of it, released at once on SIGTERM.").Default("10s"),
			service.NewIntField("max_bundle_messages").Description("Most messages per batch (1-50000); a larger transaction goes in pieces.").Default(1000).
				LintRule(`root = if this < 1 || this > 50000 { ["max_bundle_messages must be in 1-50000"] }`),
			service.NewIntField("max_bundle_bytes").Description("Most payload bytes per batch (65536-67108864).").Default(4<<20).
				LintRule(`root = if this < 65536 || this > 67108864 { ["max_bundle_bytes must be in 65536-67108864"] }`),
			service.NewDurationField("linger").Description("How long a batch may wait for more transactions before it goes (0s-5s); 0 sends as soon as nothing more is buffered.").Default("0s"),
			service.NewDurationField("heartbeat").Description("With no WAL data for this long, emit a heartbeat message so an idle source still advances (1s-1h).").Default("10s"),
			service.NewStringEnumField("truncate", "skip", "emit").Description("`skip` (counted, logged) or `emit` a `t` event to partition `all` (needs partition_by: single on every table).").Default("skip"),
			service.NewStringEnumField("snapshot", "never", "initial").Description("`never`: stream from the slot's creation. `initial`: on the first start (and after `pgrelay resync`) also copy the rows already in the tables, as `r` events, chunk by chunk while the stream runs.").Default("never"),
			service.NewIntField("chunk_rows").Description("Rows per snapshot chunk (1-100000): each chunk is one short REPEATABLE READ read between two watermarks.").Default(2000).
				LintRule(`root = if this < 1 || this > 100000 { ["chunk_rows must be in 1-100000"] }`),
		)
}

// ParseConfig reads a pg_cdc config into Config and validates it; errors start with the field path.
func ParseConfig(conf *service.ParsedConfig) (Config, error) {
	var c Config
	var err error
	str := func(dst *string, path ...string) {
		if err == nil {
			*dst, err = conf.FieldString(path...)
		}
	}
	dur := func(dst *time.Duration, path string) {
		if err == nil {
			*dst, err = conf.FieldDuration(path)
		}
	}
	integer := func(dst *int, path string) {
		if err == nil {
			*dst, err = conf.FieldInt(path)
		}
	}
	boolean := func(dst *bool, path ...string) {
		if err == nil {
			*dst, err = conf.FieldBool(path...)
		}
	}
	str(&c.Name, "name")
	if c.PG, err = pgconnect.Parse(conf); err != nil {
		return c, err
	}
	str(&c.Publication, "publication", "name")
	boolean(&c.ManagePublication, "publication", "manage")
	boolean(&c.PublishFunction, "publish_function")
	str(&c.Slot, "slot", "name")
	boolean(&c.SlotFailover, "slot", "failover")
	dur(&c.LeaseTTL, "lease_ttl")
	integer(&c.MaxBundleMessages, "max_bundle_messages")
	integer(&c.MaxBundleBytes, "max_bundle_bytes")
	dur(&c.Linger, "linger")
	dur(&c.Heartbeat, "heartbeat")
	integer(&c.ChunkRows, "chunk_rows")
	var truncate, snapshot string
	str(&truncate, "truncate")
	str(&snapshot, "snapshot")
	if err != nil {
		return c, err
	}
	c.TruncateEmit, c.SnapshotInitial = truncate == "emit", snapshot == "initial"
	if truncate != "skip" && truncate != "emit" {
		return c, fieldErr("truncate", "%q is not skip or emit", truncate)
	}
	if snapshot != "never" && snapshot != "initial" {
		return c, fieldErr("snapshot", "%q is not initial or never", snapshot)
	}
	if c.Redis, err = redisconn.Parse(conf.Namespace("redis")); err != nil {
		return c, fmt.Errorf("redis: %w", err)
	}
	if c.Tables, err = parseTables(conf); err != nil {
		return c, err
	}
	return c, c.Validate()
}

func parseTables(conf *service.ParsedConfig) ([]Table, error) {
	list, err := conf.FieldObjectList("tables")
	if err != nil {
		return nil, err
	}
	out := make([]Table, 0, len(list))
	for i, tc := range list {
		path := fmt.Sprintf("tables[%d]", i)
		var t Table
		name, err := tc.FieldString("table")
		if err != nil {
			return nil, fmt.Errorf("%s.table: %w", path, err)
		}
		t.Schema, t.Name = ParseTable(name)
		if t.Queue, err = tc.FieldString("queue"); err != nil {
			return nil, fmt.Errorf("%s.queue: %w", path, err)
		}
		pb, err := tc.FieldAny("partition_by")
		if err != nil {
			return nil, fmt.Errorf("%s.partition_by: %w", path, err)
		}
		switch v := pb.(type) {
		case string:
			switch v {
			case "key":
				t.Mode = PartitionByKey
			case "single":
				t.Mode = PartitionBySingle
			default:
				return nil, fieldErr(path+".partition_by", "%q is not key, single or a list of columns", v)
			}
		case []any:
			t.Mode = PartitionByColumns
			for _, c := range v {
				s, ok := c.(string)
				if !ok || s == "" {
					return nil, fieldErr(path+".partition_by", "columns must be non-empty strings")
				}
				t.Columns = append(t.Columns, s)
			}
		default:
			return nil, fieldErr(path+".partition_by", "use key, single or a list of columns")
		}
		out = append(out, t)
	}
	return out, nil
}
