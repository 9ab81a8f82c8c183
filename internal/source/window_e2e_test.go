package source_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pgrelay/pgrelay/internal/cdctest"
	"github.com/pgrelay/pgrelay/internal/pointer"
)

// TestWindowOfTwoKeepsEveryChangeOnce: pg_cdc into redis_queue with max_in_flight 2, so that
// full batches go two at a time (the second queued behind the first's EXEC): a snapshot of
// 20,000 rows in chunks while writers commit transactions of up to 300 changes (bundles of 100:
// most batches are full) on the snapshotted table and another, the pipeline stopped and started
// again twice meanwhile. The queue replays to both tables exactly: every change once, in order.
func TestWindowOfTwoKeepsEveryChangeOnce(t *testing.T) {
	e := newEnv(t)
	e.pg.Exec(`CREATE TABLE big (id int PRIMARY KEY, v text NOT NULL)`)
	e.pg.Exec(`INSERT INTO big SELECT g, md5(g::text) FROM generate_series(1, 20000) g`)
	e.pg.Exec(`CREATE TABLE w (id int PRIMARY KEY, v int NOT NULL)`)
	p := cdctest.Pipeline{Name: "win", DSN: e.pg.DSN(), Tables: `[{table: big, queue: q}, {table: w, queue: q}]`, Redis: e.rd.URL(),
		Source: "snapshot: initial\nchunk_rows: 500\nmax_bundle_messages: 100", Output: "max_in_flight: 2"}
	stop := startStream(t, p.YAML())
	stopWriters := make(chan struct{})
	var committed atomic.Int64
	wait := cdctest.Writers(7, 2, 5, stopWriters, func(rng *rand.Rand) bool {
		ok := bigTx(e.ctx, e, rng)
		if ok {
			committed.Add(1)
		}
		return ok
	})
	defer func() {
		select {
		case <-stopWriters:
		default:
			close(stopWriters)
			wait()
		}
	}()
	for round := 1; round <= 2; round++ {
		cdctest.Wait(t, 60*time.Second, "writers", func() (bool, string) {
			return committed.Load() >= int64(40*round), fmt.Sprint(committed.Load())
		})
		stop()
		stop = startStream(t, p.YAML())
	}
	cdctest.Wait(t, 60*time.Second, "writers", func() (bool, string) { return committed.Load() >= 120, fmt.Sprint(committed.Load()) })
	close(stopWriters)
	wait()
	e.waitSnapshotDone("win", "q", 90*time.Second)
	lsn := cdctest.CurrentLSN(t, e.pg.Pool())
	cdctest.WaitCovered(t, 120*time.Second, 100*time.Millisecond, lsn, func() *pointer.Pointer {
		return cdctest.ReadPointer(t, e.rd.Client(), "q", "win")
	})
	time.Sleep(300 * time.Millisecond) // anything beyond would be a duplicate
	e.checkOracle("q", "public.big", "id")
	e.checkOracle("q", "public.w", "id")
}

// bigTx is one transaction of 1 to 5 statements of up to 100 rows each, so of up to 500
// changes: inserts (or updates), deletes and updates of w's ids 0-999, and updates of big's rows
// (some in chunks not yet read, some read). A row another writer holds fails it at once.
func bigTx(ctx context.Context, e *env, rng *rand.Rand) bool {
	tx, err := e.pg.Pool().Begin(ctx)
	if err != nil {
		return false
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, `SET LOCAL lock_timeout = '50ms'`); err != nil {
		return false
	}
	for i, n := 0, 1+rng.IntN(5); i < n; i++ {
		k := rng.IntN(100)
		var err error
		switch op := rng.IntN(10); {
		case op < 4:
			_, err = tx.Exec(ctx, `INSERT INTO w SELECT g, $2 FROM generate_series($1::int, $1::int + $3::int) g
				ON CONFLICT (id) DO UPDATE SET v = w.v + excluded.v`, rng.IntN(1000), rng.IntN(100), k)
		case op < 6:
			_, err = tx.Exec(ctx, `DELETE FROM w WHERE id BETWEEN $1::int AND $1::int + $2::int`, rng.IntN(1000), k)
		default:
			_, err = tx.Exec(ctx, `UPDATE big SET v = v || 'x' WHERE id BETWEEN $1::int AND $1::int + $2::int`, 1+rng.IntN(20000), k)
		}
		if err != nil {
			return false
		}
	}
	return tx.Commit(ctx) == nil
}
