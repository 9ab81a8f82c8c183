package tests

import (
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/pgrelay/pgrelay/internal/cdctest"
	"github.com/pgrelay/pgrelay/internal/testenv"
)

// TestSoftDeleteRecipe runs config/pg_sink_soft_delete.yaml behind pg_cdc: a row deleted at the
// source stays in the copy with its columns and the deletion's commit time in deleted_at, a key
// deleted and inserted again is live again with its new values, and the other rows are copied as
// any cdc copy; with REPLICA IDENTITY FULL the deleted row's last values are kept too.
func TestSoftDeleteRecipe(t *testing.T) {
	e := newCDCEnv(t, "history", `[{table: public.orders, queue: orders}]`, "")
	e.queue = "orders"
	e.pg.Exec(`CREATE TABLE orders (id int PRIMARY KEY, status text NOT NULL, total numeric)`)
	src := e.start()
	defer src.Kill()
	e.waitPointer()
	dsn, copyPool := e.copyDatabase("history", `CREATE TABLE orders (id int PRIMARY KEY, status text NOT NULL, total numeric, deleted_at timestamptz)`)
	sink := testenv.StartProcess(t, []string{"REDIS_URL=" + e.rd.URL(), "TARGET_DSN=" + dsn}, testenv.Binary(t),
		"run", "-s", "http.enabled=false", "-s", "input.redis_queue.lease_ttl=3s", filepath.Join(testenv.RepoRoot(), "config", "pg_sink_soft_delete.yaml"))
	defer sink.Kill()
	before := time.Now().Add(-time.Minute)
	e.pg.Exec(`INSERT INTO orders VALUES (1, 'new', 10), (2, 'new', 20), (3, 'new', 30)`)
	e.pg.Exec(`UPDATE orders SET status = 'paid' WHERE id = 2`)
	e.pg.Exec(`UPDATE orders SET status = 'shipped', total = 31 WHERE id = 3`)
	e.pg.Exec(`DELETE FROM orders WHERE id = 3`)
	e.pg.Exec(`DELETE FROM orders WHERE id = 1`)
	e.pg.Exec(`INSERT INTO orders VALUES (1, 'again', 11)`)
	e.pg.Exec(`ALTER TABLE orders REPLICA IDENTITY FULL; INSERT INTO orders VALUES (4, 'new', 40); UPDATE orders SET total = 41 WHERE id = 4`)
	e.pg.Exec(`DELETE FROM orders WHERE id = 4`)
	rows := func() string {
		var out string
		_ = copyPool.QueryRow(e.ctx, `SELECT coalesce(string_agg(format('%s/%s/%s/%s', id, status, total, deleted_at IS NOT NULL), ',' ORDER BY id), '') FROM orders`).Scan(&out)
		return out
	}
	const want = "1/again/11/f,2/paid/20/f,3/shipped/31/t,4/new/41/t"
	cdctest.WaitEvery(t, 60*time.Second, 200*time.Millisecond, "the copy", func() (bool, string) {
		got := rows()
		return got == want, got + "; sink: " + sinkLastLines(sink.Output(), 5)
	})
	var at time.Time
	if err := copyPool.QueryRow(e.ctx, `SELECT deleted_at FROM orders WHERE id = 3`).Scan(&at); err != nil || at.Before(before) || at.After(time.Now().Add(time.Minute)) {
		t.Errorf("deleted_at of row 3: %v %v", at, err)
	}
	if strings.Contains(sink.Output(), "level=error") {
		t.Errorf("the sink logged errors:\n%s", sinkLastLines(sink.Output(), 10))
	}
}
