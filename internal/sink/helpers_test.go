package sink

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgrelay/pgrelay/internal/testenv"
)

// pgFixture is one PostgreSQL server shared by the subtests of a top-level test.
type pgFixture struct {
	pg   *testenv.Postgres
	pool *pgxpool.Pool
	n    atomic.Int64
}

func startPG(t *testing.T) *pgFixture {
	t.Helper()
	pg := testenv.StartPostgres(t)
	return &pgFixture{pg: pg, pool: pg.Pool()}
}

// name returns a fresh identifier for a table or sink.
func (f *pgFixture) name(prefix string) string {
	return fmt.Sprintf("%s_%d", prefix, f.n.Add(1))
}

func (f *pgFixture) exec(t *testing.T, sql string, args ...any) {
	t.Helper()
	if _, err := f.pool.Exec(context.Background(), sql, args...); err != nil {
		t.Fatalf("exec %q: %v", sql, err)
	}
}

// applier builds an Applier with test defaults (fast retries).
func (f *pgFixture) applier(t *testing.T, cfg Config) *Applier {
	t.Helper()
	a, err := f.applierErr(cfg)
	if err != nil {
		t.Fatalf("NewApplier: %v", err)
	}
	return a
}

func (f *pgFixture) applierErr(cfg Config) (*Applier, error) {
	if cfg.Name == "" {
		cfg.Name = f.name("sink")
	}
	if cfg.ProgressTable == "" {
		cfg.ProgressTable = DefaultProgressTable
	}
	cfg.CreateProgressTable = true
	cfg.RequireProgress = true
	cfg.RetryMax = 200 * time.Millisecond
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return NewApplier(ctx, f.pool, cfg, nil)
}

// msg is a queue message on queue q.
func msg(q string, shard int32, offset int64, payload string) *Message {
	return &Message{Queue: q, Shard: shard, Offset: offset, HasPosition: true,
		Partition: fmt.Sprintf("p%d", shard), MessageID: fmt.Sprintf("m-%d-%d", shard, offset), Payload: []byte(payload)}
}

func write(t *testing.T, a *Applier, msgs ...*Message) *Result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res, err := a.Write(ctx, msgs)
	if err != nil {
		t.Fatalf("Write: %v", err)
	}
	return res
}

// queryStrings returns the first column of each row as text ("<null>" for NULL).
func (f *pgFixture) queryStrings(t *testing.T, sql string, args ...any) []string {
	t.Helper()
	rows, err := f.pool.Query(context.Background(), sql, args...)
	if err != nil {
		t.Fatalf("query %q: %v", sql, err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var s *string
		if err := rows.Scan(&s); err != nil {
			t.Fatalf("scan: %v", err)
		}
		if s == nil {
			out = append(out, "<null>")
		} else {
			out = append(out, *s)
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatalf("query %q: %v", sql, err)
	}
	return out
}

func (f *pgFixture) one(t *testing.T, sql string, args ...any) string {
	t.Helper()
	r := f.queryStrings(t, sql, args...)
	if len(r) != 1 {
		t.Fatalf("%q returned %d rows, want 1: %v", sql, len(r), r)
	}
	return r[0]
}
