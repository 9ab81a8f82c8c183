-- Read-model recipe (docs/recipes.md): the target database of config/order_docs_projection.yaml.
-- Run once before the projection's first start:  psql "$TARGET_DSN" -f config/order_docs_target.sql
--
-- src.orders and src.order_items are copies of the source tables, kept by the projection itself
-- from the change events; public.order_docs holds one document per order, rebuilt from the copies
-- on every change; public.order_doc_source is the one definition of a document.

CREATE SCHEMA IF NOT EXISTS src;

-- The copies: the source tables' columns, types and keys (no foreign keys, no defaults: the rows
-- arrive whole from the change events).
CREATE TABLE IF NOT EXISTS src.orders (
    id         bigint PRIMARY KEY,
    customer   text,
    status     text,
    note       text,
    created_at timestamptz
);

CREATE TABLE IF NOT EXISTS src.order_items (
    order_id   bigint,
    line_no    int,
    sku        text,
    qty        int,
    unit_price numeric(12,2),
    PRIMARY KEY (order_id, line_no)
);

-- One order's document, built from the copies: the order, its items by line, and the totals.
CREATE OR REPLACE VIEW public.order_doc_source AS
SELECT o.id,
       jsonb_build_object(
           'id', o.id,
           'customer', o.customer,
           'status', o.status,
           'note', o.note,
           'created_at', o.created_at,
           'items', coalesce(i.items, '[]'::jsonb),
           'item_count', coalesce(i.item_count, 0),
           'total_qty', coalesce(i.total_qty, 0),
           'total', coalesce(i.total, 0.00)) AS doc
FROM src.orders o
LEFT JOIN LATERAL (
    SELECT jsonb_agg(jsonb_build_object(
               'line_no', l.line_no,
               'sku', l.sku,
               'qty', l.qty,
               'unit_price', l.unit_price,
               'amount', l.qty * l.unit_price) ORDER BY l.line_no) AS items,
           count(*) AS item_count,
           sum(l.qty) AS total_qty,
           sum(l.qty * l.unit_price) AS total
    FROM src.order_items l
    WHERE l.order_id = o.id
) i ON true;

-- The documents: lsn and ts are the commit LSN and commit time of the last change applied to
-- the order, so a reader knows how current a document is.
CREATE TABLE IF NOT EXISTS public.order_docs (
    id  bigint PRIMARY KEY,
    doc jsonb NOT NULL,
    lsn pg_lsn NOT NULL,
    ts  timestamptz NOT NULL
);
