// Package snapshot reads a table's existing rows in key-ordered chunks while the stream runs, the
// DBLog way: a low watermark, one short REPEATABLE READ read of at most chunk_rows rows that also
// records pg_current_snapshot(), a high watermark. The stream decides which chunk rows survive: a
// row whose key a stream transaction touched is dropped when that transaction commits between the
// watermarks, or was not visible to the chunk's snapshot (its change is, or will be, in the stream
// before the chunk's events). Survivors become `r` events at the high watermark. Rows dropped from a
// chunk whose stream events left TOASTed columns `unchanged` get a fill event so a consumer starting
// from the snapshot has every column.
//
// The pieces, each usable without the others:
//   - Spec and Read: the chunk query (composite keys, any key type, values as output-function text);
//   - Rows: a chunk's rows, their values back to back in a few blocks (no slice per value);
//   - Snapshot: pg_current_snapshot() parsed, and visibility of 32-bit stream xids;
//   - Window: what the stream saw while a chunk was in flight, and the survivors and fills it implies;
//   - Cursor: where the snapshot is, as carried by the pointer (DESIGN §3).
package snapshot
