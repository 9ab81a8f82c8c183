-- make demo: one round of the writer (inserts, updates, a delete now and then).
INSERT INTO public.orders (id, customer, total)
SELECT (random() * 1000)::bigint, 'customer-' || (random() * 50)::int, round((random() * 500)::numeric, 2)
ON CONFLICT (id) DO UPDATE SET total = excluded.total, status = 'updated', updated_at = now();
UPDATE public.orders SET status = 'shipped', updated_at = now() WHERE id = (random() * 1000)::bigint;
DELETE FROM public.orders WHERE id = (random() * 1000)::bigint AND random() < 0.2;
