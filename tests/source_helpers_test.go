package tests

import (
	"context"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"

	"github.com/pgrelay/pgrelay/internal/cdctest"
	"github.com/pgrelay/pgrelay/internal/oracle"
	"github.com/pgrelay/pgrelay/internal/pointer"
	"github.com/pgrelay/pgrelay/internal/testenv"
)

// writeConfig writes body to a file name in a directory of the test's and returns its path.
func writeConfig(t testing.TB, name, body string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// runCLI runs the binary with args to its end and returns its output (stdout and stderr); it fails
// the test when the binary fails.
func runCLI(t testing.TB, args ...string) string {
	t.Helper()
	out, err := exec.Command(testenv.Binary(t), args...).CombinedOutput()
	if err != nil {
		t.Fatalf("pgrelay %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

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
	return newCDCEnvWith(t, pg, dsn, name, tables, func(p *cdctest.Pipeline, _ *testenv.Redis) { p.Source = extra })
}

// newCDCEnvWith is newCDCEnvOn with the pipeline adjusted by adjust, given the Redis started for it.
func newCDCEnvWith(t testing.TB, pg *testenv.Postgres, dsn, name, tables string, adjust func(*cdctest.Pipeline, *testenv.Redis)) *cdcEnv {
	e := &cdcEnv{t: t, ctx: context.Background(), pg: pg, rd: testenv.StartRedis(t), name: name, queue: "q"}
	p := cdctest.Pipeline{Name: name, DSN: dsn, Tables: tables, Redis: e.rd.URL(),
		Durability: "aof", LogLevel: "info", Top: "http:\n  enabled: false\nshutdown_timeout: 20s"}
	adjust(&p, e.rd)
	e.config = writeConfig(t, "pgrelay.yaml", p.YAML())
	return e
}

func (e *cdcEnv) start() *testenv.Process {
	return testenv.StartProcess(e.t, nil, testenv.Binary(e.t), "-c", e.config)
}

func (e *cdcEnv) pointerKey() string { return cdctest.SourceKey(e.queue, e.name, "ptr") }
func (e *cdcEnv) leaseKey() string   { return cdctest.SourceKey(e.queue, e.name, "lease") }

func (e *cdcEnv) pointer() *pointer.Pointer {
	return cdctest.ReadPointer(e.t, e.rd.Client(), e.queue, e.name)
}

func (e *cdcEnv) waitPointer() {
	e.t.Helper()
	cdctest.Wait(e.t, 60*time.Second, "the pointer (pg_cdc to start)", func() (bool, string) {
		return e.pointer() != nil, "no pointer"
	})
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

func (e *cdcEnv) conn() *pgx.Conn { return cdctest.Conn(e.t, e.pg.DSN()) }

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

// randomWriter runs cdctest.RandomTx on w from two connections until stop; it returns the number
// of committed transactions.
func (e *cdcEnv) randomWriter(seed uint64, stop <-chan struct{}) func() int {
	return cdctest.Writers(seed, 2, 3, stop, func(rng *rand.Rand) bool { return cdctest.RandomTx(e.ctx, e.pg.Pool(), rng, "w") })
}
