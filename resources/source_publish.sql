-- pgrelay.publish(queue, partition, payload): a transactional message (DESIGN §9). It becomes an `m`
-- event in the named queue and partition, atomically with the transaction's row changes and in
-- commit order, and vanishes if the transaction rolls back. Nothing to vacuum, no outbox table.
-- Install by hand (psql -f resources/source_publish.sql) or with `pgrelay` once allowed; the
-- pg_cdc source must list the queue's events' consumers as usual.
--
-- The message is the text {"queue": <queue>, "payload": <payload>, "partition": <partition>}, each
-- value as PostgreSQL prints it as JSON (null when NULL): byte for byte what
-- jsonb_build_object('queue', queue, 'partition', partition, 'payload', payload)::text prints, without
-- building that jsonb value (a copy of the payload). The body is one SELECT using each argument once,
-- and the function is neither STRICT nor SECURITY DEFINER and has no SET option, so PostgreSQL inlines
-- it into the calling statement; any of those would make every call a separate function call, a few
-- µs more per event.
CREATE SCHEMA IF NOT EXISTS pgrelay;

CREATE OR REPLACE FUNCTION pgrelay.publish(queue text, partition text, payload jsonb)
RETURNS pg_lsn
LANGUAGE sql VOLATILE
AS $$
  SELECT pg_logical_emit_message(true, 'pgrelay',
    '{"queue": ' || coalesce(to_json(queue)::text, 'null')
    || ', "payload": ' || coalesce(payload::text, 'null')
    || ', "partition": ' || coalesce(to_json(partition)::text, 'null') || '}')
$$;
