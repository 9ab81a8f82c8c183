package errcode

// Code is a stable identifier of an error a user can cause, listed in docs/errors.md. Declare every
// code here, with its meaning; call sites name the constant, never a string.
type Code string

// Codes of the redis_queue output and input, the queue CLI and the lease fence between pg_cdc and the
// queue.
const (
	// Fenced means the batch's lease token is no longer the lease holder's; nothing was written
	// (redis_queue output → pg_cdc).
	Fenced Code = "fenced"
	// Blocked means a message was held back behind an earlier failure in its shard; it counts no
	// attempt (pg_sink → redis_queue input).
	Blocked Code = "blocked"
	// Paused means the sink is paused by an environment error (missing table, privileges); the
	// message counts no attempt (pg_sink → redis_queue input).
	Paused Code = "paused"
	// ShardsMismatch means `shards` is set and differs from the existing queue's count (a queue is
	// never resharded in place).
	ShardsMismatch Code = "shards_mismatch"
	// CrossSlot means one batch names queues (or a source pointer) in different Redis Cluster slots.
	CrossSlot Code = "crossslot"
	// DurabilityAOF means `durability: aof` is set but the server lacks appendonly yes and appendfsync
	// always.
	DurabilityAOF Code = "durability_aof"
	// RedisConfig means a Redis connection cannot work: a URL that does not parse, `sentinel` without
	// `master_name` or `addresses`, or `sentinel` together with `cluster_urls`, a database other than
	// 0 in `cluster_urls`; or, on connecting, a database the server does not have.
	RedisConfig Code = "redis_config"
	// RedisEviction means Redis may evict pgrelay's keys (a memory limit with a policy other than
	// noeviction), or the Redis user may not run INFO.
	RedisEviction Code = "redis_eviction"
	// ReplicasShortfall means `durability: {replicas: N}` is set and WAIT saw fewer replicas in time.
	ReplicasShortfall Code = "replicas_shortfall"
	// PointerCorrupt means a stored source pointer cannot be read (not JSON with a string `pos`).
	PointerCorrupt Code = "pointer_corrupt"
	// LayoutVersion means the queue's keys do not follow the layout this pgrelay writes and reads: a
	// layout version in meta it does not know (writer and consumer), an `off:<n>` that is not a number, a shard key that is not a
	// stream.
	LayoutVersion Code = "layout_version"
	// QueueConfig means a redis_queue output config value the linter also catches (trim_interval not
	// above 0s).
	QueueConfig Code = "queue_config"
	// BatchReshaped means a pg_cdc batch made without metadata (`metadata: false`) reached the
	// redis_queue output with another number of messages than pg_cdc made.
	BatchReshaped Code = "batch_reshaped"
	// BadQueue means a queue name is empty, over 256 bytes, or contains `{` or `}`.
	BadQueue Code = "bad_queue"
	// BadGroup means a consumer group name is empty or contains `:`, `{` or `}`.
	BadGroup Code = "bad_group"
	// BadStartFrom means the input's `start_from` is neither earliest nor latest.
	BadStartFrom Code = "bad_start_from"
	// BadStart means a start after a load (the input's `start_after_load`) does not parse, or does
	// not fit the queue: another shard count, or a position past what a shard ever held.
	BadStart Code = "bad_start"
	// StartConflict means a start after a load names a consumer group that already exists with
	// another start, or without one.
	StartConflict Code = "start_conflict"
	// StartTrimmed means entries added to a shard after a start's position were removed before the
	// group was created, so the group would miss them.
	StartTrimmed Code = "start_trimmed"
	// NoQueue means no queue of that name exists under the prefix (pgrelay queue, or a start after
	// a load).
	NoQueue Code = "no_queue"
	// ReplayAllGroups means a dead-letter replay targets a queue with several groups without
	// `--all-groups`.
	ReplayAllGroups Code = "replay_all_groups"
	// RedisACL means the Redis user may not run a command pgrelay needs, or not on pgrelay's keys
	// (NOPERM); the fix names the ACL rule to add.
	RedisACL Code = "redis_acl"
	// RedisUnreachable means no connection to Redis could be opened (refused, no such host, timed
	// out): a wrong url, or a server that is down or restarting. Transient: retried.
	RedisUnreachable Code = "redis_unreachable"
	// RedisAuth means Redis refused the user name and password (WRONGPASS), or wants a password and
	// got none (NOAUTH).
	RedisAuth Code = "redis_auth"
	// RedisTLS means TLS to Redis failed: the server's certificate is not signed by the configured
	// CA, does not name the host, or expired; the server speaks no TLS; or it wants a client
	// certificate and got none it trusts.
	RedisTLS Code = "redis_tls"
	// RedisOOM means Redis refused a write at its memory limit (maxmemory, with noeviction).
	RedisOOM Code = "redis_oom"
)

// Codes of pg_sink.
const (
	// BadPayload means the mode cannot read a payload (not UTF-8 JSON, not an object, no key, a bad
	// change event); a data error, dead-lettered after max_attempts.
	BadPayload Code = "bad_payload"
	// PayloadTooLarge means a payload is over 64 MiB and is refused before it is parsed; a data error.
	PayloadTooLarge Code = "payload_too_large"
	// NoProgressMetadata means a message lacks queue/shard/offset metadata while progress is required.
	NoProgressMetadata Code = "no_progress_metadata"
	// BadMetadata means queue/shard/offset metadata is present but not numbers, or an offset is below 1.
	BadMetadata Code = "bad_metadata"
	// TableUnmapped means a cdc sink with tables met a change event of a table no entry maps; a
	// data error, dead-lettered after max_attempts.
	TableUnmapped Code = "table_unmapped"
	// TargetMissing means the target table does not exist.
	TargetMissing Code = "target_missing"
	// TargetNotTable means the target is not a table.
	TargetNotTable Code = "target_not_table"
	// TargetNoKey means the target table has no primary key and no replica-identity index.
	TargetNoKey Code = "target_no_key"
	// TargetPrivileges means the sink's user lacks privileges on the target (the GRANT is printed).
	TargetPrivileges Code = "target_privileges"
	// TargetChanged means the target table no longer accepts the sink's statement.
	TargetChanged Code = "target_changed"
	// TargetColumnMissing means a column the sink writes is not a column of the target.
	TargetColumnMissing Code = "target_column_missing"
	// TargetColumnGenerated means a column the sink writes is generated.
	TargetColumnGenerated Code = "target_column_generated"
	// KeyColumnMissing means a configured `key` column is not a column of the target.
	KeyColumnMissing Code = "key_column_missing"
	// KeyNotUnique means no usable unique index covers exactly the configured `key`.
	KeyNotUnique Code = "key_not_unique"
	// ProgressTableMissing means the progress table is missing and create_progress_table is false.
	ProgressTableMissing Code = "progress_table_missing"
	// ProgressTableMismatch means the progress table has the wrong shape.
	ProgressTableMismatch Code = "progress_table_mismatch"
	// ProgressTableCreate means the progress table cannot be created.
	ProgressTableCreate Code = "progress_table_create"
	// ProgressTablePrivileges means the sink's user lacks SELECT, INSERT or UPDATE on the progress
	// table, or USAGE on its schema (the GRANT is printed).
	ProgressTablePrivileges Code = "progress_table_privileges"
	// ProgressTableName means progress_table is not schema.name.
	ProgressTableName Code = "progress_table_name"
	// SQLStatement means PostgreSQL refuses a mode sql statement.
	SQLStatement Code = "sql_statement"
	// SQLParamsMismatch means the params count differs from the statement's $n placeholders.
	SQLParamsMismatch Code = "sql_params_mismatch"
	// SQLParamUnknown means a params entry is not a known metadata name.
	SQLParamUnknown Code = "sql_param_unknown"
	// SQLParamPath means a params entry is not a path.
	SQLParamPath Code = "sql_param_path"
	// SinkConfig means a config combination the linter also catches.
	SinkConfig Code = "sink_config"
	// SinkError means an environment error without a more specific code.
	SinkError Code = "sink_error"
)

// Codes of pg_cdc and its PostgreSQL connection.
const (
	// WALLevel means the server's wal_level is not logical.
	WALLevel Code = "wal_level"
	// Version means PostgreSQL is older than 14, or slot.failover is set before 17.
	Version Code = "version"
	// TableMissing means a configured table does not exist or is not a table (a view, a foreign
	// table...), or is UNLOGGED (it writes no WAL).
	TableMissing Code = "table_missing"
	// TablePattern means the tables[] patterns match no table at all, or more than a source streams.
	TablePattern Code = "table_pattern"
	// ReplicaIdentity means a table that is not append-only has no primary key and no usable
	// REPLICA IDENTITY.
	ReplicaIdentity Code = "replica_identity"
	// PartitionBy means partition_by names a missing column or one outside the key (without REPLICA
	// IDENTITY FULL or append_only), an append-only table without a key is partitioned by key, or
	// truncate: emit lacks partition_by: single.
	PartitionBy Code = "partition_by"
	// ColumnList means a table's columns list cannot be a publication column list: PostgreSQL
	// before 15, a listed column missing or generated, a key or partition_by column not listed, or
	// REPLICA IDENTITY FULL on a table that is not append-only.
	ColumnList Code = "column_list"
	// Publication means a publication (the main one, or the append-only tables' insert-only one)
	// is missing, has row filters or column lists other than the configured columns, holds other tables or misses some, or does not
	// publish exactly its operations, and publication.manage is false (or the role may not manage it);
	// or, while streaming, a configured table left its publication or got another column list there.
	Publication Code = "publication"
	// SlotLost means the pointer exists but the slot does not; it is never recreated silently.
	SlotLost Code = "slot_lost"
	// SlotInvalidated means the slot was invalidated because the WAL it needed was removed.
	SlotInvalidated Code = "slot_invalidated"
	// SlotAhead means the slot's confirmed position is past the pointer: something else consumed it,
	// or Redis lost acknowledged data.
	SlotAhead Code = "slot_ahead"
	// SlotMismatch means the pointer belongs to another slot, or the slot is not a logical pgoutput
	// slot of the database.
	SlotMismatch Code = "slot_mismatch"
	// SystemChanged means the pointer belongs to another PostgreSQL system (a restored or replaced
	// server).
	SystemChanged Code = "system_changed"
	// RelationChanged means a table's key columns changed while streaming.
	RelationChanged Code = "relation_changed"
	// PublishFunction is a warning: publish_function is true but the role may not install
	// pgrelay.publish(); the source streams on.
	PublishFunction Code = "publish_function"
	// SourcePrivileges means pg_cdc's role lacks something it needs: the REPLICATION attribute,
	// SELECT on a configured table or USAGE on its schema (the table is refused), or EXECUTE on
	// pg_logical_emit_message; the fix prints the statement that grants it.
	SourcePrivileges Code = "source_privileges"
	// SlotFailover is a warning: slot.failover differs from the existing slot's failover flag and
	// pg_cdc could not change it; the source streams on with the slot as it is.
	SlotFailover Code = "slot_failover"
	// ClusterSlot means that on Redis Cluster the source's queues hash to different slots.
	ClusterSlot Code = "cluster_slot"
	// PGConfig means PostgreSQL connection fields that cannot work: a dsn that does not parse (or
	// none and no host), a tls.mode PostgreSQL does not know, TLS files without the mode that reads
	// them, a client certificate without its key, a port out of range.
	PGConfig Code = "pg_config"
	// PGTLS means TLS to PostgreSQL failed (certificate, host name, expiry, or no TLS on the server).
	PGTLS Code = "pg_tls"
	// PGHBA means pg_hba.conf turned the connection away.
	PGHBA Code = "pg_hba"
	// PGLogin means the role may not log in (no LOGIN attribute) or may not connect to the database
	// (no CONNECT privilege).
	PGLogin Code = "pg_login"
	// PGUnreachable means no connection to PostgreSQL could be opened (refused, no such host, timed
	// out): a wrong host or port, or a server that is down or restarting. Transient: retried.
	PGUnreachable Code = "pg_unreachable"
	// PGPassword means PostgreSQL refused the role's password, or wanted one and got none (28P01).
	PGPassword Code = "pg_password"
	// PGDatabase means the database named in the connection does not exist (3D000).
	PGDatabase Code = "pg_database"
	// PGLimit means PostgreSQL refused for want of a resource its configuration bounds: every WAL
	// sender (max_wal_senders) or every replication slot (max_replication_slots) is in use.
	PGLimit Code = "pg_limit"
	// PGReadOnly means the server takes no writes: a standby (in recovery), or a session made
	// read-only (default_transaction_read_only); pg_cdc and pg_sink need the primary.
	PGReadOnly Code = "pg_read_only"
	// Resync is informational: a session ended because `pgrelay resync` was requested.
	Resync Code = "resync"
)

// Transient reports whether c names a condition that may end by itself, a server that does not
// answer: the component retries as for an uncoded connection error, its phase stays
// "connecting" rather than "error", and metrics count it as transient; the code and its fix are
// in the log line and the status.
func (c Code) Transient() bool { return c == PGUnreachable || c == RedisUnreachable }
