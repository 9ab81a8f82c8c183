-- pgrelay.publish(queue, partition, payload): a transactional message (DESIGN §9). It becomes an `m`
-- event in the named queue and partition, atomically with the transaction's row changes and in
-- commit order, and vanishes if the transaction rolls back. Nothing to vacuum, no outbox table.
-- Install by hand (psql -f resources/source_publish.sql) or with `pgrelay` once allowed; the
-- pg_cdc source must list the queue's events' consumers as usual.
CREATE SCHEMA IF NOT EXISTS pgrelay;

CREATE OR REPLACE FUNCTION pgrelay.publish(queue text, partition text, payload jsonb)
RETURNS pg_lsn
LANGUAGE sql VOLATILE
AS $$
  SELECT pg_logical_emit_message(true, 'pgrelay',
    jsonb_build_object('queue', queue, 'partition', partition, 'payload', payload)::text)
$$;
