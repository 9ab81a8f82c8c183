package cdctest

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// WriterColumns is the shape of the tables RandomTx writes: CREATE TABLE <name> WriterColumns.
const WriterColumns = `(id int PRIMARY KEY, v text, n numeric, j jsonb, g int)`

// Writers runs n writers until stop is closed. Each calls tx again and again with its own
// generator (PCG seeded with seed and the writer's index) and pauses 0 to pause-1 ms after each
// call (not at all when pause is 0); tx reports whether its transaction committed. wait waits for
// the writers to end and returns how many transactions committed.
func Writers(seed uint64, n, pause int, stop <-chan struct{}, tx func(*rand.Rand) bool) (wait func() int) {
	var committed atomic.Int64
	var wg sync.WaitGroup
	for w := 0; w < n; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(seed, uint64(w)))
			for {
				select {
				case <-stop:
					return
				default:
				}
				if tx(rng) {
					committed.Add(1)
				}
				if pause > 0 {
					time.Sleep(time.Duration(rng.IntN(pause)) * time.Millisecond)
				}
			}
		}(w)
	}
	return func() int { wg.Wait(); return int(committed.Load()) }
}

// RandomTx runs one random transaction of 1 to 4 statements on pool, each on one of tables (of
// shape WriterColumns; the first is used when there is only one): upserts with numerics of up to 37 digits
// and nested JSON holding integers above 2^53, updates, deletes, and key changes from ids 0-299
// into 300-599. A statement that fails (two writers on one row, a key change onto a taken key)
// rolls the transaction back. It reports whether the transaction committed.
func RandomTx(ctx context.Context, pool *pgxpool.Pool, rng *rand.Rand, tables ...string) bool {
	tx, err := pool.Begin(ctx)
	if err != nil {
		return false
	}
	defer tx.Rollback(ctx)
	for i, n := 0, 1+rng.IntN(4); i < n; i++ {
		table := tables[0]
		if len(tables) > 1 {
			table = tables[rng.IntN(len(tables))]
		}
		tbl := pgx.Identifier{table}.Sanitize()
		id := rng.IntN(300)
		var err error
		switch op := rng.IntN(10); {
		case op < 4:
			_, err = tx.Exec(ctx, `INSERT INTO `+tbl+` VALUES ($1, $2, $3::numeric, $4::jsonb, $5) ON CONFLICT (id) DO UPDATE SET v = excluded.v`,
				id, fmt.Sprintf("v%d|\\%d", rng.IntN(1000), id), fmt.Sprintf("%d.%018d", rng.Int64(), rng.Int64N(1e18)),
				fmt.Sprintf(`{"big": %d, "nested": {"a": [1, "x"]}}`, uint64(1)<<60+uint64(rng.IntN(1000))), rng.IntN(5))
		case op < 7:
			_, err = tx.Exec(ctx, `UPDATE `+tbl+` SET v = $2, n = n + 1 WHERE id = $1`, id, fmt.Sprintf("u%d", rng.IntN(1000)))
		case op < 8:
			_, err = tx.Exec(ctx, `DELETE FROM `+tbl+` WHERE id = $1`, id)
		default:
			_, err = tx.Exec(ctx, `UPDATE `+tbl+` SET id = $2 WHERE id = $1`, id, 300+rng.IntN(300))
		}
		if err != nil {
			return false
		}
	}
	return tx.Commit(ctx) == nil
}
