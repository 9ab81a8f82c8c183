package tests

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redpanda-data/benthos/v4/public/service"

	"github.com/pgrelay/pgrelay/internal/testenv"
	_ "github.com/pgrelay/pgrelay/output"
)

// TestSinkLintRules: the linter catches the impossible combinations of pg_sink fields.
func TestSinkLintRules(t *testing.T) {
	linter := service.GlobalEnvironment().NewComponentConfigLinter()
	cases := []struct {
		name, yaml, want string
	}{
		{"valid upsert", "name: s\ntable: t\nmode: upsert\n", ""},
		{"valid sql", "name: s\nmode: sql\nstatement: UPDATE a SET b = $1::int WHERE id = $2::int\nparams: [$.b, $.id]\n", ""},
		{"sql without statement", "name: s\nmode: sql\n", "mode sql needs a statement"},
		{"upsert without table", "name: s\nmode: upsert\n", "mode upsert needs a table"},
		{"statement outside sql", "name: s\ntable: t\nmode: append\nstatement: SELECT 1\n", "statement and params are only used in mode sql"},
		{"key in append", "name: s\ntable: t\nmode: append\nkey: [id]\n", "key is only used in modes upsert and cdc"},
		{"table in sql", "name: s\ntable: t\nmode: sql\nstatement: SELECT $1\nparams: [$]\n", "table is not used in mode sql"},
		{"params count", "name: s\nmode: sql\nstatement: UPDATE a SET b = $1 WHERE id = $2\nparams: [$.b]\n", "one entry per $n"},
		{"metadata in sql", "name: s\nmode: sql\nstatement: SELECT $1\nparams: [$]\nmetadata: {offset: off}\n", "metadata columns are not used in mode sql"},
		{"progress table without schema", "name: s\ntable: t\nmode: cdc\nprogress_table: progress\n", "progress_table must be schema.name"},
		{"bad mode", "name: s\ntable: t\nmode: merge\n", "not a valid option"},
		{"empty name", "name: ''\ntable: t\nmode: cdc\n", "name must not be empty"},
		{"max_in_flight 0", "name: s\ntable: t\nmode: cdc\nmax_in_flight: 0\n", "max_in_flight must be between"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			yaml := "host: 127.0.0.1\n" + c.yaml // a connection: without one lint refuses every case
			lints, err := linter.LintOutputYAML([]byte("pg_sink:\n  " + strings.ReplaceAll(strings.TrimSuffix(yaml, "\n"), "\n", "\n  ") + "\n"))
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, l := range lints {
				got = append(got, l.What)
			}
			all := strings.Join(got, "; ")
			if c.want == "" && len(got) > 0 || c.want != "" && !strings.Contains(all, c.want) {
				t.Fatalf("lints %q, want %q", all, c.want)
			}
		})
	}
}

// TestSinkStreamWithGenericInput runs pg_sink in a stream fed by a producer that sets the queue
// metadata itself, and by one that does not (refused, then written at-least-once when allowed).
func TestSinkStreamWithGenericInput(t *testing.T) {
	pg := testenv.StartPostgres(t)
	pg.Exec(`CREATE TABLE items (id int PRIMARY KEY, name text, qty int DEFAULT 1)`)
	run := func(extra string, batches ...service.MessageBatch) []error {
		b := service.NewStreamBuilder()
		if err := b.SetLoggerYAML("level: warn"); err != nil {
			t.Fatal(err)
		}
		produce, err := b.AddBatchProducerFunc()
		if err != nil {
			t.Fatal(err)
		}
		if err := b.AddOutputYAML(fmt.Sprintf("pg_sink:\n  dsn: %q\n  name: items\n  table: items\n  mode: upsert\n  retry_max_wait: 100ms\n%s", pg.DSN(), extra)); err != nil {
			t.Fatal(err)
		}
		stream, err := b.Build()
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		go func() { _ = stream.Run(ctx) }()
		var errs []error
		for _, batch := range batches {
			pctx, pcancel := context.WithTimeout(ctx, 5*time.Second)
			errs = append(errs, produce(pctx, batch))
			pcancel()
		}
		if err := stream.StopWithin(10 * time.Second); err != nil {
			t.Fatal(err)
		}
		return errs
	}
	queued := func(offset int64, payload string) *service.Message {
		m := service.NewMessage([]byte(payload))
		m.MetaSetMut("queue", "items")
		m.MetaSetMut("shard", int64(0))
		m.MetaSetMut("offset", offset)
		m.MetaSetMut("partition", "p")
		m.MetaSetMut("message_id", fmt.Sprint("id-", offset))
		return m
	}
	errs := run("",
		service.MessageBatch{queued(1, `{"id":1,"name":"a"}`), queued(2, `{"id":2,"name":"b","qty":5}`)},
		service.MessageBatch{queued(2, `{"id":2,"name":"replayed"}`), queued(3, `{"id":1,"qty":9}`)},
		service.MessageBatch{service.NewMessage([]byte(`{"id":3,"name":"no metadata"}`))},
	)
	if errs[0] != nil || errs[1] != nil || errs[2] == nil || !strings.Contains(errs[2].Error(), "no_progress_metadata") {
		t.Fatalf("errors %v", errs)
	}
	errs = run("  require_progress: false\n", service.MessageBatch{service.NewMessage([]byte(`{"id":3,"name":"generic"}`))})
	if errs[0] != nil {
		t.Fatal(errs[0])
	}
	rows, err := pg.Pool().Query(context.Background(), `SELECT concat_ws('/', id, name, qty) FROM items ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for rows.Next() {
		var s string
		_ = rows.Scan(&s)
		got = append(got, s)
	}
	rows.Close()
	if strings.Join(got, ",") != "1/a/9,2/b/5,3/generic/1" {
		t.Fatalf("rows %v", got)
	}
}
