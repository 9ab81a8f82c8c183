-- make demo: one round of the writer (run every 0.5 s): a few inserts or updates, one more update, a
-- delete now and then, each statement its own transaction.
INSERT INTO public.orders (id, customer, total)
SELECT DISTINCT ON (id) id, 'customer-' || (random() * 50)::int, round((random() * 500)::numeric, 2)
FROM (SELECT (random() * 1000)::bigint AS id FROM generate_series(1, 4)) AS r
ON CONFLICT (id) DO UPDATE SET total = excluded.total, status = 'updated', updated_at = now();
UPDATE public.orders SET status = 'shipped', updated_at = now() WHERE id = (random() * 1000)::bigint;
DELETE FROM public.orders WHERE id = (random() * 1000)::bigint AND random() < 0.2;
