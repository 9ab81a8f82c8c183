-- pgrelay: the pg_sink progress table (DESIGN §7).
-- pg_sink creates it at start when `create_progress_table: true` (the default), under an advisory
-- lock so several replicas may start at once. To create it by hand instead, run this file (with
-- pgrelay.sink_progress replaced by your `progress_table`) and set `create_progress_table: false`.
-- One row per (sink, queue, shard): the last queue offset whose effects are committed in this
-- database. The sink writes it in the same transaction as the rows, so a redelivered message at or
-- below last_offset is skipped: exactly-once effects.
CREATE SCHEMA IF NOT EXISTS pgrelay;
CREATE TABLE IF NOT EXISTS pgrelay.sink_progress (
    sink        text        NOT NULL,
    queue       text        NOT NULL,
    shard       integer     NOT NULL,
    last_offset bigint      NOT NULL DEFAULT 0,
    updated_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (sink, queue, shard)
);
