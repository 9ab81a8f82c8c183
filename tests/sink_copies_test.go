package tests

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgrelay/pgrelay/internal/cdctest"
	"github.com/pgrelay/pgrelay/internal/oracle"
)

// ledgerDDL creates TestTransactionalCopy's tables in schema s: orders whose total is the sum of
// their items' quantities, and items that reference them.
func ledgerDDL(s string) string {
	return inSchema(s, `
CREATE TABLE S.orders (id bigint PRIMARY KEY, total bigint NOT NULL);
CREATE TABLE S.items (order_id bigint NOT NULL REFERENCES S.orders, n int, qty bigint NOT NULL, PRIMARY KEY (order_id, n));`)
}

// ledgerBroken counts the orders of schema s whose total is not the sum of their items': none, in
// any state a source transaction left.
func ledgerBroken(s string) string {
	return inSchema(s, `SELECT count(*) FROM S.orders o
		WHERE o.total <> coalesce((SELECT sum(qty) FROM S.items i WHERE i.order_id = o.id), 0)`)
}

// TestTransactionalCopy: pg_cdc writes one envelope per transaction (`envelopes`) and one pg_sink
// in mode cdc with tables applies each whole in its batch's transaction, so the copy only ever
// holds states the source committed. Writers keep every order's total equal to its items' sum in
// each transaction (a new order with its items, quantity moved between two orders' items, an item's
// key changed, an order deleted with its items) while a reader checks the copy for that without
// pause and the sink is SIGKILLed once; the copy's foreign key holds throughout (an envelope that
// deletes items and then their order is applied in that order). After the writers stop the copy
// equals the source.
func TestTransactionalCopy(t *testing.T) {
	e := newCDCEnv(t, "txcopy", `[{table: public.orders, queue: q}, {table: public.items, queue: q}]`, "envelopes:\n  - {queue: q}")
	e.pg.Exec(ledgerDDL("public"))
	src := e.start()
	defer src.Kill()
	e.waitPointer()
	dsn, copies := e.copyDatabase("txcopy", "CREATE SCHEMA copy;"+ledgerDDL("copy"))
	cfg := sinkPipeline{redisURL: e.rd.URL(), queue: "q", group: "txcopy", dsn: dsn, sink: "txcopy",
		tables: `{"public.*": "copy.*"}`, mode: "cdc", batchCount: 16, maxAttempts: 3}.YAML()
	stopRead, readDone := make(chan struct{}), make(chan struct{})
	var reads, broken atomic.Int64
	go func() {
		defer close(readDone)
		for {
			select {
			case <-stopRead:
				return
			default:
			}
			var n int64
			if err := copies.QueryRow(e.ctx, ledgerBroken("copy")).Scan(&n); err != nil {
				t.Errorf("reader: %v", err)
				return
			}
			reads.Add(1)
			if n > 0 && broken.Add(1) == 1 {
				t.Errorf("the copy holds %d orders whose total is not their items' sum: a transaction applied in part", n)
			}
		}
	}()
	stopReader := sync.OnceFunc(func() { close(stopRead); <-readDone })
	defer stopReader() // before the pools close
	copyUnderSinkKill(t, e, cfg, copies, func(stop <-chan struct{}) int { return ledgerWriter(e.ctx, t, e.pg.Pool(), 7, stop) },
		func(pool *pgxpool.Pool, schema string) string {
			var orders, items string
			_ = pool.QueryRow(e.ctx, fmt.Sprintf(`SELECT coalesce(string_agg(id || '/' || total, ',' ORDER BY id), '') FROM %s.orders`, schema)).Scan(&orders)
			_ = pool.QueryRow(e.ctx, fmt.Sprintf(`SELECT coalesce(string_agg(order_id || '.' || n || '/' || qty, ',' ORDER BY order_id, n), '') FROM %s.items`, schema)).Scan(&items)
			return orders + " | " + items
		})
	stopReader()
	if reads.Load() < 20 {
		t.Errorf("the reader checked the copy only %d times", reads.Load())
	}
	// status names where the sink writes: its tables entries
	if out, _ := runStatus(t, writeConfig(t, "sink.yaml", cfg), false); !strings.Contains(out, "tables public.* → copy.*") {
		t.Errorf("status does not name the sink's tables:\n%s", out)
	}
	if n, err := e.rd.Client().XLen(e.ctx, "pgrelay:{q}:dlq").Result(); err != nil || n > 0 {
		t.Errorf("%d envelopes dead-lettered (%v)", n, err)
	}
	var n int64
	if err := e.pg.Pool().QueryRow(e.ctx, ledgerBroken("public")).Scan(&n); err != nil || n > 0 {
		t.Fatalf("the writers broke the source's totals: %d orders (%v)", n, err)
	}
}

// ledgerWriter commits random transactions until stop, each leaving every order's total equal to
// its items' sum: a new order with 1–3 items; 1–5 moved from an item of one order to an item of
// another (both totals changed); an item's n changed (a key change); an order deleted with its
// items. It returns the transactions committed.
func ledgerWriter(ctx context.Context, t *testing.T, pool *pgxpool.Pool, seed uint64, stop <-chan struct{}) int {
	next := int64(1)
	return writeTransactions(ctx, t, pool, seed, stop, func(rng *rand.Rand) string {
		a, b := rng.Int64N(next)+1, rng.Int64N(next)+1
		switch k := rng.IntN(10); {
		case k < 4 || next < 5:
			var items string
			total := 0
			for i := 1; i <= 1+rng.IntN(3); i++ {
				q := 10 + rng.IntN(90)
				total += q
				items += fmt.Sprintf(`INSERT INTO items VALUES (%d, %d, %d);`, next, i, q)
			}
			next++
			return fmt.Sprintf(`INSERT INTO orders VALUES (%d, %d);`, next-1, total) + items
		case k < 8:
			if a == b {
				return ""
			}
			x := 1 + rng.IntN(5)
			// both orders' first item, when both have one with enough left
			return fmt.Sprintf(`WITH f AS (SELECT order_id, min(n) AS n FROM items WHERE order_id IN (%[1]d, %[2]d) GROUP BY order_id),
					ok AS (SELECT count(*) = 2 AND bool_and(i.qty >= %[3]d OR i.order_id = %[2]d) AS go FROM f JOIN items i USING (order_id, n)),
					moved AS (UPDATE items i SET qty = i.qty + CASE WHEN i.order_id = %[1]d THEN -%[3]d ELSE %[3]d END
						FROM f, ok WHERE ok.go AND i.order_id = f.order_id AND i.n = f.n RETURNING i.order_id)
				UPDATE orders o SET total = o.total + CASE WHEN o.id = %[1]d THEN -%[3]d ELSE %[3]d END
				FROM moved WHERE o.id = moved.order_id;`, a, b, x)
		case k < 9:
			return fmt.Sprintf(`UPDATE items SET n = n + 10 WHERE order_id = %d AND n = (SELECT max(n) FROM items WHERE order_id = %d);`, a, a)
		}
		return fmt.Sprintf(`DELETE FROM items WHERE order_id = %d; DELETE FROM orders WHERE id = %d;`, a, a)
	})
}

// TestKeyChangeOfAGoneRowThroughASink: a key change whose unchanged TOASTed value cannot be read
// back (the row was deleted before pg_cdc decoded the change) reaches the sink as a `c` that lists
// the value in `unchanged`, followed by its `d`. A cdc sink whose column is NOT NULL applies it as
// nothing (no stored row of the new key): nothing is dead-lettered and the copy equals the source.
func TestKeyChangeOfAGoneRowThroughASink(t *testing.T) {
	e := newCDCEnv(t, "gone", `[{table: public.docs, queue: q}]`, "")
	ddl := `CREATE TABLE S.docs (id int PRIMARY KEY, note text, body text NOT NULL); ALTER TABLE S.docs ALTER body SET STORAGE EXTERNAL;`
	e.pg.Exec(inSchema("public", ddl))
	src := e.start()
	e.waitPointer()
	dsn, copies := e.copyDatabase("gone", "CREATE SCHEMA copy;"+inSchema("copy", ddl))
	p := startSinkPipeline(t, sinkPipeline{redisURL: e.rd.URL(), queue: "q", group: "gone", dsn: dsn, sink: "gone",
		table: "copy.docs", mode: "cdc", batchCount: 16, maxAttempts: 2}.YAML())
	defer p.Kill()
	e.pg.Exec(`INSERT INTO docs VALUES (1, 'one', repeat('x', 5000)), (3, 'three', repeat('y', 5000))`)
	count := func() (n int) {
		_ = copies.QueryRow(e.ctx, `SELECT count(*) FROM copy.docs`).Scan(&n)
		return n
	}
	cdctest.WaitEvery(t, 60*time.Second, 200*time.Millisecond, "the rows in the copy", func() (bool, string) {
		return count() == 2, sinkLastLines(p.Output(), 5)
	})
	src.Kill() // the key change is decoded after the row is gone
	e.pg.Exec(`UPDATE docs SET id = 2, note = 'moved' WHERE id = 1`)
	e.pg.Exec(`DELETE FROM docs WHERE id = 2`)
	e.pg.Exec(`UPDATE docs SET note = 'last' WHERE id = 3`)
	src = e.start()
	defer src.Kill()
	cdctest.WaitEvery(t, 60*time.Second, 200*time.Millisecond, "the copy to equal the source", func() (bool, string) {
		var got string
		_ = copies.QueryRow(e.ctx, `SELECT coalesce(string_agg(id || '/' || note || '/' || length(body), ','), '') FROM copy.docs`).Scan(&got)
		return got == "3/last/5000", got + "; " + sinkLastLines(p.Output(), 5)
	})
	var unchanged bool
	entries, err := oracle.ReadQueue(e.ctx, e.rd.Client(), "pgrelay", "q")
	if err != nil {
		t.Fatal(err)
	}
	for _, en := range entries {
		unchanged = unchanged || strings.Contains(string(en.Payload), `"op":"c"`) && strings.Contains(string(en.Payload), `"unchanged":["body"]`)
	}
	if !unchanged {
		t.Fatalf("setup: no c with an unchanged body in the queue")
	}
	if n, err := e.rd.Client().XLen(e.ctx, "pgrelay:{q}:dlq").Result(); err != nil || n > 0 {
		t.Errorf("%d dead letters (%v): %s", n, err, sinkLastLines(p.Output(), 5))
	}
}
