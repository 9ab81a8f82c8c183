package tests

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"

	"github.com/pgrelay/pgrelay/internal/convert"
	"github.com/pgrelay/pgrelay/internal/oracle"
	"github.com/pgrelay/pgrelay/internal/pointer"
	"github.com/pgrelay/pgrelay/internal/testenv"
)

// cdcEnv is PostgreSQL + Redis + a pg_cdc → redis_queue config for the binary.
type cdcEnv struct {
	t      testing.TB
	ctx    context.Context
	pg     *testenv.Postgres
	rd     *testenv.Redis
	name   string
	queue  string
	config string
}

func newCDCEnv(t testing.TB, name, tables, extra string) *cdcEnv {
	pg := testenv.StartPostgres(t)
	return newCDCEnvOn(t, pg, pg.DSN(), name, tables, extra)
}

// newCDCEnvOn is newCDCEnv on a server already started, pg_cdc connecting through dsn.
func newCDCEnvOn(t testing.TB, pg *testenv.Postgres, dsn, name, tables, extra string) *cdcEnv {
	e := &cdcEnv{t: t, ctx: context.Background(), pg: pg, rd: testenv.StartRedis(t), name: name, queue: "q"}
	e.config = filepath.Join(t.TempDir(), "pgrelay.yaml")
	yaml := fmt.Sprintf(`http:
  enabled: false
input:
  pg_cdc:
    name: %s
    dsn: %s
    tls: {mode: disable}
    tables: %s
    redis: {url: %s}
    lease_ttl: 3s
    heartbeat: 1s
%s
output:
  redis_queue:
    url: %s
    durability: aof
logger:
  level: info
shutdown_timeout: 20s
`, name, dsn, tables, e.rd.URL(), indentLines(extra, "    "), e.rd.URL())
	if err := os.WriteFile(e.config, []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
	return e
}

func indentLines(s, pad string) string {
	if strings.TrimSpace(s) == "" {
		return ""
	}
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return pad + strings.Join(lines, "\n"+pad)
}

func (e *cdcEnv) start() *testenv.Process {
	return testenv.StartProcess(e.t, nil, testenv.Binary(e.t), "-c", e.config)
}

func (e *cdcEnv) pointerKey() string { return "pgrelay:{" + e.queue + "}:src:" + e.name + ":ptr" }
func (e *cdcEnv) leaseKey() string   { return "pgrelay:{" + e.queue + "}:src:" + e.name + ":lease" }

func (e *cdcEnv) pointer() *pointer.Pointer {
	raw, err := e.rd.Client().Get(e.ctx, e.pointerKey()).Bytes()
	if err != nil {
		return nil
	}
	p, err := pointer.Parse(raw)
	if err != nil {
		e.t.Errorf("pointer: %v", err)
		return nil
	}
	return &p
}

func (e *cdcEnv) waitPointer() {
	e.t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for e.pointer() == nil {
		if time.Now().After(deadline) {
			e.t.Fatal("no pointer: pg_cdc never started")
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// sampleSlot checks, every 100 ms until stop, that the slot's confirmed_flush_lsn is never past
// the pointer (slot read first, then the pointer, which only moves forward). The pointer's lsn is
// inclusive and the slot's exclusive, so a fresh slot sits at pointer + 1.
func (e *cdcEnv) sampleSlot(stop <-chan struct{}) (samples *atomic.Int64, wait func()) {
	samples = &atomic.Int64{}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			case <-time.After(100 * time.Millisecond):
			}
			var cf *string
			err := e.pg.Pool().QueryRow(e.ctx, `SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = $1`,
				"pgrelay_"+strings.ReplaceAll(e.name, "-", "_")).Scan(&cf)
			if err != nil || cf == nil {
				continue
			}
			p := e.pointer()
			if p == nil {
				continue
			}
			slot, _ := pglogrepl.ParseLSN(*cf)
			if slot > p.LSNValue()+1 {
				e.t.Errorf("slot confirmed_flush_lsn %s is past the pointer %s", slot, p.LSN)
			}
			samples.Add(1)
		}
	}()
	return samples, wg.Wait
}

func (e *cdcEnv) conn() *pgx.Conn {
	cfg, _ := pgx.ParseConfig(e.pg.DSN())
	convert.ApplySettings(cfg.RuntimeParams)
	c, err := pgx.ConnectConfig(e.ctx, cfg)
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { c.Close(context.Background()) })
	return c
}

// converge waits until the replayed queue equals the table, then checks again 3 s later.
func (e *cdcEnv) converge(table string, key ...string) *oracle.Result {
	e.t.Helper()
	conn := e.conn()
	deadline := time.Now().Add(90 * time.Second)
	var diffs []string
	var res *oracle.Result
	for pass := 0; pass < 2; {
		entries, err := oracle.ReadQueue(e.ctx, e.rd.Client(), "pgrelay", e.queue)
		if err != nil {
			e.t.Fatal(err)
		}
		res = oracle.Replay(entries)
		rows, err := oracle.TableRows(e.ctx, conn, table, key)
		if err != nil {
			e.t.Fatal(err)
		}
		diffs = append(res.Problems, oracle.Compare(res.Tables[table], rows)...)
		if len(diffs) == 0 {
			pass++
			if pass == 1 {
				time.Sleep(3 * time.Second) // no late duplicates
			}
			continue
		}
		if pass > 0 || time.Now().After(deadline) {
			for i, d := range diffs {
				if i < 30 {
					e.t.Error(d)
				}
			}
			e.t.Fatalf("%d differences between the queue and %s", len(diffs), table)
		}
		time.Sleep(250 * time.Millisecond)
	}
	return res
}

// randomWriter runs random transactions on w (inserts, updates, deletes, key changes,
// multi-statement transactions) until stop; it returns the number of committed transactions.
func (e *cdcEnv) randomWriter(seed uint64, stop <-chan struct{}) func() int {
	return runWriters(seed, stop, 3, e.randomTx)
}

// runWriters runs two writers, each calling tx with its own generator seeded from seed and pausing
// 0..pause-1 ms after each transaction, until stop; wait returns how many committed (tx true).
func runWriters(seed uint64, stop <-chan struct{}, pause int, tx func(*rand.Rand) bool) (wait func() int) {
	var committed atomic.Int64
	var wg sync.WaitGroup
	for w := 0; w < 2; w++ {
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
				time.Sleep(time.Duration(rng.IntN(pause)) * time.Millisecond)
			}
		}(w)
	}
	return func() int { wg.Wait(); return int(committed.Load()) }
}

func (e *cdcEnv) randomTx(rng *rand.Rand) bool {
	tx, err := e.pg.Pool().Begin(e.ctx)
	if err != nil {
		return false
	}
	defer tx.Rollback(e.ctx)
	for i, n := 0, 1+rng.IntN(4); i < n; i++ {
		id := rng.IntN(300)
		var err error
		switch op := rng.IntN(10); {
		case op < 4:
			_, err = tx.Exec(e.ctx, `INSERT INTO w VALUES ($1, $2, $3::numeric, $4::jsonb, $5) ON CONFLICT (id) DO UPDATE SET v = excluded.v`,
				id, fmt.Sprintf("v%d|\\%d", rng.IntN(1000), id), fmt.Sprintf("%d.%018d", rng.Int64(), rng.Int64N(1e18)),
				fmt.Sprintf(`{"big": %d, "nested": {"a": [1, "x"]}}`, uint64(1)<<60+uint64(rng.IntN(1000))), rng.IntN(5))
		case op < 7:
			_, err = tx.Exec(e.ctx, `UPDATE w SET v = $2, n = n + 1 WHERE id = $1`, id, fmt.Sprintf("u%d", rng.IntN(1000)))
		case op < 8:
			_, err = tx.Exec(e.ctx, `DELETE FROM w WHERE id = $1`, id)
		default:
			_, err = tx.Exec(e.ctx, `UPDATE w SET id = $2 WHERE id = $1`, id, 300+rng.IntN(300))
		}
		if err != nil {
			return false
		}
	}
	return tx.Commit(e.ctx) == nil
}
