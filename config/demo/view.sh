# make demo's live view (run by scripts/demo every 2 s with DEMO_PG_DSN and DEMO_REDIS_URL set): one
# line with the rows in public.orders, the messages written to the queue "orders" (all shards: the sum
# of their last offsets; nothing trims the demo's queue, and a stream entry may hold several), the rows in
# public.orders_copy, and whether the two tables are equal (md5 of each whole table in key order, read
# in one snapshot). The copy trails the writer by a moment, so in_sync=no between writes is normal;
# then `differ` counts the ids whose rows are not (yet) the same.
q() { psql -X -Atq "$DEMO_PG_DSN" -c "$1" 2>/dev/null || echo '? ? ? ?'; }
r() { redis-cli -u "$DEMO_REDIS_URL" "$@" 2>/dev/null; }

read -r orders copy same differ <<<"$(q "
  SELECT (SELECT count(*) FROM public.orders),
         (SELECT count(*) FROM public.orders_copy),
         (SELECT md5(coalesce(string_agg(t::text, E'\n' ORDER BY id), '')) FROM public.orders t) =
         (SELECT md5(coalesce(string_agg(t::text, E'\n' ORDER BY id), '')) FROM public.orders_copy t),
         (SELECT count(DISTINCT id) FROM ((TABLE public.orders EXCEPT TABLE public.orders_copy)
                                          UNION ALL (TABLE public.orders_copy EXCEPT TABLE public.orders)) d)" | tr '|' ' ')"

shards=$(r HGET 'pgrelay:{orders}:meta' shards)
queue=0
for ((n = 0; n < ${shards:-0}; n++)); do
  off=$(r HGET 'pgrelay:{orders}:meta' "off:$n")
  queue=$((queue + ${off:-0}))
done
[ -n "$shards" ] || queue='?'

case "$same" in
  t) sync=yes ;;
  f) sync="no differ=$differ" ;;
  *) sync='?' ;;
esac
echo "orders=$orders queue=$queue copy=$copy in_sync=$sync"
