package cdctest

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/pgrelay/pgrelay/internal/convert"
	"github.com/pgrelay/pgrelay/internal/pointer"
	"github.com/pgrelay/pgrelay/internal/redisconn"
)

// SourceKey is the Redis key of a pg_cdc source's `what` (ptr, lease, status, resync) under the
// default prefix.
func SourceKey(queue, name, what string) string {
	return redisconn.Key("pgrelay", queue, "src", name, what)
}

// Conn opens a connection to dsn with the session settings pg_cdc reads with (so the oracle's
// TableRows renders values as the events do); it closes when tb ends.
func Conn(tb testing.TB, dsn string) *pgx.Conn {
	tb.Helper()
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		tb.Fatal(err)
	}
	convert.ApplySettings(cfg.RuntimeParams)
	c, err := pgx.ConnectConfig(context.Background(), cfg)
	if err != nil {
		tb.Fatalf("connect: %v", err)
	}
	tb.Cleanup(func() { c.Close(context.Background()) })
	return c
}

// CurrentLSN is the server's pg_current_wal_lsn().
func CurrentLSN(tb testing.TB, pool *pgxpool.Pool) pglogrepl.LSN {
	tb.Helper()
	var s string
	if err := pool.QueryRow(context.Background(), `SELECT pg_current_wal_lsn()::text`).Scan(&s); err != nil {
		tb.Fatalf("pg_current_wal_lsn: %v", err)
	}
	lsn, err := pglogrepl.ParseLSN(s)
	if err != nil {
		tb.Fatalf("parse %s: %v", s, err)
	}
	return lsn
}

// ReadPointer reads the pointer of source name feeding queue; nil while there is none (or Redis
// cannot answer). A pointer that does not parse fails tb (Errorf) and reads as nil.
func ReadPointer(tb testing.TB, rdb redis.Cmdable, queue, name string) *pointer.Pointer {
	raw, err := rdb.Get(context.Background(), SourceKey(queue, name, "ptr")).Bytes()
	if err != nil {
		return nil
	}
	p, err := pointer.Parse(raw)
	if err != nil {
		tb.Errorf("pointer of %s: %v", name, err)
		return nil
	}
	return &p
}

// WaitCovered waits, asking read every `every`, until the pointer is at or past lsn with no
// transaction half in: every transaction committed before lsn is then in the queue.
func WaitCovered(tb testing.TB, timeout, every time.Duration, lsn pglogrepl.LSN, read func() *pointer.Pointer) {
	tb.Helper()
	WaitEvery(tb, timeout, every, "the pointer to cover "+lsn.String(), func() (bool, string) {
		p := read()
		return p != nil && p.InTxn == nil && p.LSNValue() >= lsn, fmt.Sprintf("pointer %+v", p)
	})
}

// WaitStatus waits, asking every 100 ms, until a field of the status hash of source name shows
// want (a phase or an error code, as it appears in the JSON).
func WaitStatus(tb testing.TB, timeout time.Duration, rdb redis.Cmdable, queue, name, want string) {
	tb.Helper()
	WaitEvery(tb, timeout, 100*time.Millisecond, want+" in the status of "+name, func() (bool, string) {
		st, _ := rdb.HGetAll(context.Background(), SourceKey(queue, name, "status")).Result()
		for _, v := range st {
			if strings.Contains(v, want) {
				return true, ""
			}
		}
		return false, fmt.Sprint(st)
	})
}
