package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/pgrelay/pgrelay/internal/queue"
	"github.com/pgrelay/pgrelay/internal/testenv"
)

// runCommand runs one of pgrelay's subcommands in-process and returns what it printed and its
// error (a cli.ExitCoder for a failure).
func runCommand(cmd *cli.Command, args ...string) (string, error) {
	var out strings.Builder
	app := &cli.App{Name: "pgrelay", Writer: &out, ErrWriter: &out, Commands: []*cli.Command{cmd},
		ExitErrHandler: func(*cli.Context, error) {}}
	err := app.Run(append([]string{"pgrelay"}, args...))
	return out.String(), err
}

// TestQueueConfigWithTLS: `pgrelay queue info -c` connects with the pipeline's tls block (CA and
// client certificate) to a Redis that speaks only TLS and requires a client certificate; a tls
// block naming another CA is refused.
func TestQueueConfigWithTLS(t *testing.T) {
	r := testenv.StartRedisTLS(t)
	w := queue.NewWriter(r.Client(), queue.WriterConfig{Shards: 2})
	msgs := make([]queue.Message, 5)
	for i := range msgs {
		msgs[i] = queue.Message{Queue: "tq", Partition: fmt.Sprint(i), ID: fmt.Sprint("m", i), Payload: []byte(`{}`)}
	}
	if _, err := w.Write(context.Background(), msgs, nil); err != nil {
		t.Fatal(err)
	}
	config := func(ca string) string {
		return writeConfig(t, fmt.Sprintf(`
input:
  redis_queue:
    url: %s
    queue: tq
    group: g
    tls:
      enabled: true
      root_cas_file: %s
      client_certs:
        - cert_file: %s
          key_file: %s
output:
  drop: {}
`, r.URL(), ca, r.TLS.ClientCertFile, r.TLS.ClientKeyFile))
	}
	out, err := runCommand(Queue(), "queue", "info", "-c", config(r.TLS.CAFile), "--json", "--timeout", "20s")
	if err != nil {
		t.Fatalf("queue info -c over TLS: %v\n%s", err, out)
	}
	var info queue.Info
	if err := json.Unmarshal([]byte(out), &info); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if info.Queue != "tq" || info.Shards != 2 || info.Length != 5 {
		t.Fatalf("info %+v", info)
	}
	out, err = runCommand(Queue(), "queue", "info", "-c", config(r.TLS.OtherCAFile), "--timeout", "5s")
	if err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Fatalf("a server certificate of an untrusted CA was accepted: %v\n%s", err, out)
	}
}

// TestQueuePosition: `pgrelay queue position` prints every shard's last id and entries added, in
// text and --json, in the form the redis_queue input's start_after_load reads; --pg waits on
// PostgreSQL for the transactions in progress (here an open write transaction, until it commits).
func TestQueuePosition(t *testing.T) {
	r := testenv.StartRedis(t)
	pg := testenv.StartPostgres(t)
	ctx := context.Background()
	w := queue.NewWriter(r.Client(), queue.WriterConfig{Shards: 3})
	msgs := make([]queue.Message, 7)
	for i := range msgs {
		msgs[i] = queue.Message{Queue: "pq", Partition: fmt.Sprint(i), ID: fmt.Sprint("m", i), Payload: []byte(`{}`)}
	}
	for i := range msgs { // an entry each (entries added counts stream entries)
		if _, err := w.Write(ctx, msgs[i:i+1], nil); err != nil {
			t.Fatal(err)
		}
	}
	out, err := runCommand(Queue(), "queue", "position", "--url", r.URL(), "--json", "pq")
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	var rep positionReport
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if rep.Shards != 3 || len(rep.Shard) != 3 || rep.Waited {
		t.Fatalf("report %+v", rep)
	}
	var added int64
	for n, p := range rep.Shard {
		last, err := r.Client().XRevRangeN(ctx, w.Layout().Stream("pq", n), "+", "-", 1).Result()
		if err != nil {
			t.Fatal(err)
		}
		want := "0-0"
		if len(last) == 1 {
			want = last[0].ID
		}
		if p.ID != want {
			t.Fatalf("shard %d: position %s, want %s", n, p.ID, want)
		}
		added += p.Added
	}
	if added != 7 {
		t.Fatalf("entries added %d, want 7", added)
	}
	s, err := queue.ParseStart(rep.Positions, "1:1:", "0/0")
	if err != nil || s.PositionsText() != rep.Positions {
		t.Fatalf("positions %q do not parse back: %v", rep.Positions, err)
	}
	text, err := runCommand(Queue(), "queue", "position", "--url", r.URL(), "pq")
	if err != nil || !strings.Contains(text, "positions: "+rep.Positions+"\n") {
		t.Fatalf("text output: %v\n%s", err, text)
	}
	if out, err := runCommand(Queue(), "queue", "position", "--url", r.URL(), "nope"); err == nil || !strings.Contains(err.Error(), "no_queue") {
		t.Fatalf("a missing queue: %v\n%s", err, out)
	}

	// --pg waits for a write transaction open at the call
	pg.Exec(`CREATE TABLE t (x int)`)
	tx, err := pg.Pool().Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `INSERT INTO t VALUES (1)`); err != nil {
		t.Fatal(err)
	}
	type result struct {
		out string
		err error
	}
	done := make(chan result, 1)
	go func() {
		out, err := runCommand(Queue(), "queue", "position", "--url", r.URL(), "--pg", pg.DSN(), "--json", "pq")
		done <- result{out, err}
	}()
	select {
	case res := <-done:
		t.Fatalf("--pg returned while a write transaction was open: %v\n%s", res.err, res.out)
	case <-time.After(time.Second):
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case res := <-done:
		if res.err != nil || !strings.Contains(res.out, `"waited": true`) {
			t.Fatalf("--pg: %v\n%s", res.err, res.out)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("--pg did not return after the commit")
	}
}

// TestQueueUsage: more than one queue name, or none, gets the usage line.
func TestQueueUsage(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"queue", "info"}, "usage: pgrelay queue info [flags] <queue>"},
		{[]string{"queue", "position", "a", "b"}, "one queue name only, got 2 arguments"},
	} {
		out, err := runCommand(Queue(), c.args...)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: %v (%s), want %q", c.args, err, out, c.want)
		}
		if ec, ok := err.(cli.ExitCoder); !ok || ec.ExitCode() != 2 {
			t.Errorf("%v: exit %v, want 2", c.args, err)
		}
	}
}
