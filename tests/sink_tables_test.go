package tests

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgrelay/pgrelay/internal/cdctest"
)

// inSchema is sql with its tables written S.name taken from schema s instead: the source's tables
// and their copies' in one text.
func inSchema(s, sql string) string { return strings.ReplaceAll(sql, "S.", s+".") }

// sinkTablesDDL creates the two tables of TestOneSinkSeveralTables in schema s.
func sinkTablesDDL(s string) string {
	return inSchema(s, `
CREATE TABLE S.orders (id bigint PRIMARY KEY, status text NOT NULL, total numeric NOT NULL);
CREATE TABLE S."Order Items" (order_id bigint, n int, sku text, qty int NOT NULL, PRIMARY KEY (order_id, n));`)
}

// TestOneSinkSeveralTables: pg_cdc streams two tables (one with a name that needs quoting) into
// one queue, and one pg_sink in mode cdc with `tables: {"public.*": "copy.*"}` keeps copies of both
// in another database; writers change orders and their items together (inserts, updates, key
// changes, deletes) while the sink is SIGKILLed once; after they stop both copies equal the source
// row for row.
func TestOneSinkSeveralTables(t *testing.T) {
	e := newCDCEnv(t, "several", `[{table: public.orders, queue: q}, {table: "public.Order Items", queue: q}]`, "")
	e.pg.Exec(sinkTablesDDL("public"))
	src := e.start()
	defer src.Kill()
	e.waitPointer()
	dsn, copies := e.copyDatabase("copies", "CREATE SCHEMA copy;"+sinkTablesDDL("copy"))
	cfg := sinkPipeline{redisURL: e.rd.URL(), queue: "q", group: "copies", dsn: dsn, sink: "copies",
		tables: `{"public.*": "copy.*"}`, mode: "cdc", batchCount: 64, maxAttempts: 3}.YAML()
	copyUnderSinkKill(t, e, cfg, copies, func(stop <-chan struct{}) int { return ordersWriter(e.ctx, t, e.pg.Pool(), 11, stop) },
		func(pool *pgxpool.Pool, schema string) string {
			var orders, items string
			_ = pool.QueryRow(e.ctx, fmt.Sprintf(`SELECT coalesce(string_agg(format('%%s/%%s/%%s', id, status, total), ',' ORDER BY id), '') FROM %s.orders`, schema)).Scan(&orders)
			_ = pool.QueryRow(e.ctx, fmt.Sprintf(`SELECT coalesce(string_agg(format('%%s.%%s/%%s/%%s', order_id, n, sku, qty), ',' ORDER BY order_id, n), '') FROM %s."Order Items"`, schema)).Scan(&items)
			return orders + " | " + items
		})
}

// copyUnderSinkKill runs a sink pipeline (cfg) that copies the source's public.orders and its
// items into schema copy of copies while writer commits transactions until stop (it returns how
// many); once the copy has orders the sink is SIGKILLed and started again; after the writer stops,
// the copy must come to equal the source as dump (of a pool and a schema) reads them.
func copyUnderSinkKill(t *testing.T, e *cdcEnv, cfg string, copies *pgxpool.Pool, writer func(stop <-chan struct{}) int,
	dump func(pool *pgxpool.Pool, schema string) string) {
	p := startSinkPipeline(t, cfg)
	stop := make(chan struct{})
	done := make(chan int)
	go func() { done <- writer(stop) }()
	cdctest.WaitEvery(t, 60*time.Second, 200*time.Millisecond, "the sink applying", func() (bool, string) {
		var n int
		_ = copies.QueryRow(e.ctx, `SELECT count(*) FROM copy.orders`).Scan(&n)
		return n > 0, sinkLastLines(p.Output(), 5)
	})
	time.Sleep(time.Second)
	p.Kill()
	time.Sleep(500 * time.Millisecond)
	p = startSinkPipeline(t, cfg)
	time.Sleep(2 * time.Second)
	close(stop)
	if n := <-done; n < 50 {
		t.Fatalf("only %d transactions committed", n)
	}
	want := dump(e.pg.Pool(), "public")
	if !strings.Contains(want, "/") || !strings.Contains(want, ".") {
		t.Fatalf("the source holds too little: %s", want)
	}
	cdctest.WaitEvery(t, 90*time.Second, 500*time.Millisecond, "the copy to equal the source", func() (bool, string) {
		got := dump(copies, "copy")
		return got == want, fmt.Sprintf("copy %d bytes, source %d; sink: %s", len(got), len(want), sinkLastLines(p.Output(), 5))
	})
}

// copyDatabase creates database db on the source's server with ddl, for a sink's copies, and
// returns its DSN and a pool on it (closed at the test's end).
func (e *cdcEnv) copyDatabase(db, ddl string) (string, *pgxpool.Pool) {
	e.t.Helper()
	dsn := e.pg.CreateDatabase(db)
	pool, err := pgxpool.New(e.ctx, dsn)
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(pool.Close)
	if _, err := pool.Exec(e.ctx, ddl); err != nil {
		e.t.Fatal(err)
	}
	return dsn, pool
}

// ordersWriter commits random transactions on orders and their items until stop: a new order
// with 1–3 items, an order's status and an item's quantity changed, an item moved to another n
// (a key change), an order deleted with its items. It returns the transactions committed.
func ordersWriter(ctx context.Context, t *testing.T, pool *pgxpool.Pool, seed uint64, stop <-chan struct{}) int {
	next := int64(1)
	return writeTransactions(ctx, t, pool, seed, stop, func(rng *rand.Rand) string {
		id := rng.Int64N(next) + 1
		switch k := rng.IntN(10); {
		case k < 4 || next < 5:
			items := ""
			for i := 1; i <= 1+rng.IntN(3); i++ {
				items += fmt.Sprintf(`INSERT INTO "Order Items" VALUES (%d, %d, 'sku%d', %d);`, next, i, rng.IntN(100), 1+rng.IntN(9))
			}
			next++
			return fmt.Sprintf(`INSERT INTO orders VALUES (%d, 'new', %d.%02d);`, next-1, rng.IntN(1000), rng.IntN(100)) + items
		case k < 7:
			return fmt.Sprintf(`UPDATE orders SET status = 'paid', total = total + 1 WHERE id = %d; UPDATE "Order Items" SET qty = qty + 1 WHERE order_id = %d AND n = 1;`, id, id)
		case k < 9:
			return fmt.Sprintf(`UPDATE "Order Items" SET n = n + 10 WHERE order_id = %d AND n = (SELECT max(n) FROM "Order Items" WHERE order_id = %d);`, id, id)
		}
		return fmt.Sprintf(`DELETE FROM "Order Items" WHERE order_id = %d; DELETE FROM orders WHERE id = %d;`, id, id)
	})
}

// writeTransactions commits the transactions tx writes (the text of its statements; "" to skip a
// turn), drawing from a random source of seed, until stop; it returns how many committed.
func writeTransactions(ctx context.Context, t *testing.T, pool *pgxpool.Pool, seed uint64, stop <-chan struct{}, tx func(rng *rand.Rand) string) int {
	rng := rand.New(rand.NewPCG(seed, seed))
	for n := 0; ; {
		select {
		case <-stop:
			return n
		default:
		}
		sql := tx(rng)
		if sql == "" {
			continue
		}
		if _, err := pool.Exec(ctx, "BEGIN;"+sql+"COMMIT;"); err != nil {
			t.Errorf("writer: %v", err)
			return n
		}
		n++
	}
}
