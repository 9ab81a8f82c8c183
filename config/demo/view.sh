# make demo's live view: one line of counts (run by scripts/demo every 2 s).
q() { psql -X -Atq "$DEMO_PG_DSN" -c "$1" 2>/dev/null || echo '?'; }
echo "orders=$(q 'SELECT count(*) FROM public.orders')"
