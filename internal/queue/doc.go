// Package queue is pgrelay's Redis Streams queue (DESIGN §4 and §6): the key layout, the shard
// function, the Writer behind the redis_queue output, the consumer machinery behind the
// redis_queue input, retention, the inspection used by `pgrelay queue info|dlq`, and the start of a
// group that follows a load from PostgreSQL (Start, ReadPositions: `pgrelay queue position`).
//
// # Layout
//
// Every key of queue q is `<prefix>:{q}:...` (Layout): `meta` (hash: shards, version, off:<n>),
// `s:<n>` (the stream of shard n), `g:<group>:lease:<n>`, `g:<group>:attempts`, `g:<group>:members`,
// `g:<group>:start` (only for a group started after a load), `dlq`.
// A message's shard is Shard(partition, shards) = CRC-32 (IEEE) of the partition mod shards.
// Entry fields, always all of them and in this order: off, p, id, tx, ts, h, d. `h` is the
// optional header JSON and is written as "" when a message has none (one field set for every
// entry keeps the stream compact and simple to read for any client).
//
// # Writing (for producers such as pg_cdc)
//
//	w := queue.NewWriter(rdb, queue.WriterConfig{Prefix: "pgrelay", Shards: 16})
//	if err := w.Connect(ctx); err != nil { ... }          // ping + durability check
//	res, err := w.Write(ctx, msgs, &queue.Cover{
//		LeaseKey: leaseKey, Fence: token,          // fenced: the lease key must hold token
//		PointerKey: ptrKey, Pointer: ptrJSON, Pos: pos, // moves the pointer to ptrJSON
//	})
//
// Write makes one atomic write per batch, an optimistic transaction (WATCH, reads, MULTI … EXEC;
// write_tx.go), or a call of resources/queue_write.lua after repeated conflicts: every check before any write
// (the lease holds the fence, else an error with errcode code "fenced"; the stored pointer's `pos`
// strictly below Cover.Pos, else ResultDuplicate with nothing written, which is success; the shard
// count and layout version match the queue's meta), then XADD of each message with the next
// offsets of its shard, then SET of the pointer. With len(msgs) == 0 and a cover it is a pure pointer compare-and-set.
// A nil or zero Cover writes unfenced and moves no pointer. Cover.Pos is compared byte-wise (see
// docs/batch-contract.md); a stored pointer that is not JSON with a string `pos` is an error with
// code "pointer_corrupt".
//
// A batch larger than MaxScriptMessages / MaxScriptBytes is written in several writes, each fenced
// and checked against Cover.Pos; only the last sets the pointer, so only such a batch is not atomic.
// Transient failures (lost connection, LOADING, failover) are retried inside Write for up to
// WriterConfig.RetryFor; a retried covered write is safe (its repeat is a duplicate), a retried
// plain write may repeat messages under the same ids.
//
// On Redis Cluster all keys of one write must share a slot: a batch over several queues (or a
// pointer under another queue's tag) fails with code "crossslot"; give each source one queue.
// Durability.AOF makes Connect refuse servers without appendonly yes + appendfsync always
// (code "durability_aof"); Durability.Replicas pipelines WAIT after the EXEC (or the script) on the
// same connection and a shortfall is an error with code "replicas_shortfall" (the data may be written:
// retry the same covered batch, which then comes back as a duplicate after a fresh WAIT).
package queue
