-- make demo: the demo table (the source of the pipelines in config/demo/).
CREATE TABLE IF NOT EXISTS public.orders (
  id bigint PRIMARY KEY,
  customer text NOT NULL,
  total numeric(12,2) NOT NULL,
  status text NOT NULL DEFAULT 'new',
  updated_at timestamptz NOT NULL DEFAULT now()
);

-- The copy that 30-orders_copy.yaml keeps equal to public.orders (same columns, key and defaults).
CREATE TABLE IF NOT EXISTS public.orders_copy (LIKE public.orders INCLUDING ALL);
