-- make demo: the demo table (the source of the pipelines in config/demo/).
CREATE TABLE IF NOT EXISTS public.orders (
  id bigint PRIMARY KEY,
  customer text NOT NULL,
  total numeric(12,2) NOT NULL,
  status text NOT NULL DEFAULT 'new',
  updated_at timestamptz NOT NULL DEFAULT now()
);
