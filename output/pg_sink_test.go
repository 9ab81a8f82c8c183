package output

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"testing"

	"github.com/redpanda-data/benthos/v4/public/service"

	"github.com/pgrelay/pgrelay/internal/errcode"
	"github.com/pgrelay/pgrelay/internal/sink"
	"github.com/pgrelay/pgrelay/internal/testenv"
)

// TestToSinkMessage: the queue position and created_at are read whether an input sets them as
// integers (redis_queue) or as strings, and a position that is not one is refused with its code.
func TestToSinkMessage(t *testing.T) {
	for _, tc := range []struct {
		name           string
		meta           map[string]any
		shard          int32
		offset, create int64
		hasPos, bad    bool
	}{
		{"integers", map[string]any{"queue": "q", "shard": int64(3), "offset": int64(42), "created_at": int64(1700000000000)}, 3, 42, 1700000000000, true, false},
		{"strings", map[string]any{"queue": "q", "shard": "3", "offset": "42", "created_at": "1700000000000"}, 3, 42, 1700000000000, true, false},
		{"no position", map[string]any{"partition": "p"}, 0, 0, 0, false, false},
		{"offset not a number", map[string]any{"queue": "q", "shard": int64(1), "offset": "x"}, 0, 0, 0, false, true},
		{"shard beyond int32", map[string]any{"queue": "q", "shard": int64(1) << 40, "offset": int64(1)}, 0, 0, 0, false, true},
		{"no queue", map[string]any{"shard": int64(1), "offset": int64(1)}, 0, 0, 0, false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := service.NewMessage([]byte(`{"id":1}`))
			for k, v := range tc.meta {
				m.MetaSetMut(k, v)
			}
			var sm sink.Message
			err := toSinkMessage(m, &sm)
			if tc.bad {
				if !errcode.Is(err, errcode.BadMetadata) {
					t.Fatalf("error %v, want %s", err, errcode.BadMetadata)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if sm.HasPosition != tc.hasPos || sm.Shard != tc.shard || sm.Offset != tc.offset || sm.CreatedAt != tc.create || string(sm.Payload) != `{"id":1}` {
				t.Fatalf("got %+v", sm)
			}
		})
	}
}

// TestPGSinkKeepsAConnectionWhileIdle: the sink's pool keeps a connection open however long the
// sink idles (pgxpool closes connections idle for MaxConnIdleTime, a minute, down to MinConns), and
// that connection is open from the sink's start.
func TestPGSinkKeepsAConnectionWhileIdle(t *testing.T) {
	pg := testenv.StartPostgres(t)
	pg.Exec(`CREATE TABLE kept (id int PRIMARY KEY, v text)`)
	s := connectedSink(t, fmt.Sprintf("dsn: %q\nname: kept\ntable: kept\nmode: upsert\n", pg.DSN()), service.MockResources())
	if got := s.pool.Config().MinConns; got < 1 {
		t.Errorf("the sink's pool keeps %d connections while idle; want at least 1", got)
	}
	if idle := s.pool.Stat().IdleConns(); idle < 1 {
		t.Errorf("%d idle connections after Connect; want at least 1", idle)
	}
}

// TestPGSinkWarnsOfOtherTables: a cdc sink of one table logs, once per table, a warning naming an
// event table after the first it meets and the fix (`tables`), and still applies the events.
func TestPGSinkWarnsOfOtherTables(t *testing.T) {
	pg := testenv.StartPostgres(t)
	pg.Exec(`CREATE TABLE one_copy (id int PRIMARY KEY)`)
	var logs testenv.SyncBuffer
	ctx := context.Background()
	s := connectedSink(t, fmt.Sprintf("dsn: %q\nname: one\ntable: one_copy\nmode: cdc\nrequire_progress: false\n", pg.DSN()),
		service.MockResources(service.MockResourcesOptUseLogger(service.NewLoggerFromSlog(slog.New(slog.NewTextHandler(&logs, nil))))))
	ev := func(table string, id int) *service.Message {
		return service.NewMessage(fmt.Appendf(nil, `{"op":"c","table":%q,"key":{"id":%d},"after":{"id":%d},"before":null}`, table, id, id))
	}
	for _, batch := range []service.MessageBatch{{ev("public.a", 1), ev("public.b", 2)}, {ev("public.b", 3), ev("public.a", 4)}} {
		if err := s.WriteBatch(ctx, batch); err != nil {
			t.Fatal(err)
		}
	}
	out := logs.String()
	if n := strings.Count(out, "change events of table public.b reach this sink besides those of public.a"); n != 1 || !strings.Contains(out, "use tables") {
		t.Errorf("%d warnings of public.b, want 1 naming tables:\n%s", n, out)
	}
	var rows int
	if err := pg.Pool().QueryRow(ctx, `SELECT count(*) FROM one_copy`).Scan(&rows); err != nil || rows != 4 {
		t.Errorf("%d rows (%v), want 4", rows, err)
	}
}

// connectedSink is the pg_sink output of yaml with res, connected, closed when the test ends.
func connectedSink(t *testing.T, yaml string, res *service.Resources) *pgSink {
	t.Helper()
	parsed, err := PgSinkSpec().ParseYAML(yaml, nil)
	if err != nil {
		t.Fatal(err)
	}
	conf, err := PgSinkConfigFromParsed(parsed)
	if err != nil {
		t.Fatal(err)
	}
	s := newPGSink(conf, res)
	if err := s.Connect(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close(context.Background()) })
	return s
}
