package source_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"

	"github.com/pgrelay/pgrelay/internal/benchenv"
	"github.com/pgrelay/pgrelay/internal/cdctest"
	"github.com/pgrelay/pgrelay/internal/testenv"
)

// TestBacklogIsReadInLargePieces: a backlog of 60,000 changes written while pg_cdc was stopped is
// read, once it starts, in large reads of the replication connection: the process's read system
// calls over the catch-up stay within one per millisecond (the coalescer's wait) plus a startup
// allowance (260-420 measured), where a reader that reads as soon as data arrives takes one per
// few changes (8,800-10,100 with the session's behind and loaded flags never set). Not parallel:
// it counts every read of this process (/proc/self/io), and no parallel test runs beside a
// sequential one.
func TestBacklogIsReadInLargePieces(t *testing.T) {
	e := &env{t: t, pg: testenv.StartPostgres(t), rd: testenv.StartRedis(t), ctx: context.Background()}
	e.pg.Exec(`CREATE TABLE big (id bigint PRIMARY KEY, v text)`)
	yaml := fmt.Sprintf(`
input:
  pg_cdc:
    name: bl
    dsn: %s
    tls: {mode: disable}
    tables: [{table: big, queue: bl}]
    redis: {url: %s}
    lease_ttl: 3s
output:
  drop: {}
logger: {level: warn}
`, e.pg.DSN(), e.rd.URL())
	stop := startStream(t, yaml)
	e.waitPointer("bl", "bl")
	stop()

	const changes, perTx = 60000, 1000
	var before pglogrepl.LSN
	for i := 0; i < changes; i += perTx {
		if i+perTx >= changes {
			before = currentLSN(t, e)
		}
		e.pg.Exec(`INSERT INTO big SELECT g, 'value ' || g FROM generate_series($1::bigint, $2::bigint) g`, i, i+perTx-1)
	}
	r0 := benchenv.SelfReadCalls(t)
	start := time.Now()
	stop = startStream(t, yaml)
	defer stop()
	cdctest.Wait(t, 60*time.Second, "the backlog delivered", func() (bool, string) {
		lsn := e.pointerLSN("bl")
		return lsn > before, fmt.Sprintf("pointer at %s, want past %s", lsn, before)
	})
	r1 := benchenv.SelfReadCalls(t)
	took := time.Since(start)
	reads := r1 - r0
	// at most one wait (1 ms) per read that drains the socket, plus the startup's reads and the
	// full ones (256 KiB each: a few dozen here)
	limit := took.Milliseconds() + 3000
	t.Logf("%d read system calls for %d changes in %v (limit %d)", reads, changes, took.Round(time.Millisecond), limit)
	if reads > limit {
		t.Fatalf("%d read system calls for a backlog of %d changes in %v, want at most %d: the WAL was read as it arrived, a few changes per read",
			reads, changes, took.Round(time.Millisecond), limit)
	}
}
