// Package source is the pg_cdc machinery (DESIGN §5): start checks, the managed publication and
// slot, pgoutput decoding into change events (DESIGN §2), bundling with covers, lease ownership
// and the ack path that tells PostgreSQL a position only once it is durably in the queue.
//
// The Benthos plugin (input/pg_cdc.go) is a thin shell over Source.
//
// Files by job:
//   - source.go: the Source, its phases and the ownership loop (lease, sessions with backoff);
//     batch.go hands out one Batch at a time (Next, building the next one ahead) and takes the
//     output's verdict (Ack); coverwriter.go writes the pointer for outputs that acknowledge
//     without writing it.
//   - start.go: a session's start (server, table, publication and publish function checks, then
//     settling the pointer and the slot); tables.go plans the pointer's table list and snapshot
//     cursor; rejoin.go puts back a table that left the publications and reads it again;
//     privileges.go checks the role's privileges; catalog.go reads and checks the tables
//     (refusing them one by one); publication.go settles the publications (the main one, and the
//     insert-only one of the append-only tables) and watches them while streaming; slot.go the
//     slot.
//   - session.go starts replication and runs one streaming life; walreader.go receives the WAL and
//     reports the flush position in standby status updates, coalesce.go batches its reads while
//     the stream is behind or under load, pollconn_linux.go keeps the replication socket out of
//     Go's network poller (pollconn_other.go elsewhere); heartbeat.go keeps an idle slot moving
//     and reports the slot's lag.
//   - decode.go turns pgoutput messages into items of change events (written by internal/event),
//     with arena.go's memory for their bytes; envelope.go makes one message per transaction of an
//     enveloped queue; readback.go reads back unchanged TOASTed values once their transaction is
//     visible.
//   - itemqueue.go is the bounded hand-over from the reader to the bundler; bundler.go cuts
//     batches and their covers; behind.go tells when the stream is behind the writers
//     (catch-up batching).
//   - The snapshot: snapshot.go is the snapshotter, reading chunks between watermarks while
//     streaming; snapshot_reader.go is the WAL reader's side (the stream's effects on the table
//     being read, the watermarks, chunks handed over at or ahead of their high watermark);
//     snapshot_render.go renders a chunk's rows as `r` events; snapshot_share.go decides when the
//     next chunk may be read; progress.go is its progress (the periodic log line and what
//     `pgrelay status` shows); snapshot_resync.go starts over on request.
//   - config.go and cluster.go are the configuration and its checks (the spec and its parser are
//     the plugin's, in input/pg_cdc.go); admin.go is what an operator does outside a running
//     pipeline: read the status, request a resync, tear a source down (the pgrelay subcommands in
//     internal/cli call it).
package source
