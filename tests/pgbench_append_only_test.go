package tests

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/pgrelay/pgrelay/internal/cdctest"
	"github.com/pgrelay/pgrelay/internal/oracle"
	"github.com/pgrelay/pgrelay/internal/queue"
	"github.com/pgrelay/pgrelay/internal/testenv"
)

// TestPgbenchHistoryStreamsAsAppendOnly: pgbench's four tables (pgbench -i, scale 1, accounts
// trimmed to 10,000) stream
// through the binary into a queue each, pgbench_history (no key) as append_only partitioned by
// tid, while pgbench runs (with its own start: vacuum, truncate of pgbench_history). Once the load
// stops, every queue replays exactly to its table: the keyed ones (snapshot: initial) by key,
// pgbench_history as a multiset of rows, every id once, so each insert arrived exactly once. A
// keyless table not configured append-only (audit) is refused alone: its code in the log,
// `pgrelay status --json` (with the pointer's fields) and pgrelay_source_table_refused, nothing in
// its queue, while the others stream.
func TestPgbenchHistoryStreamsAsAppendOnly(t *testing.T) {
	pg := testenv.StartPostgres(t)
	bench := pgbenchBinary(t, pg)
	queues := []struct{ table, queue, key string }{
		{"public.pgbench_accounts", "accounts", "aid"},
		{"public.pgbench_branches", "branches", "bid"},
		{"public.pgbench_tellers", "tellers", "tid"},
		{"public.pgbench_history", "history", ""},
	}
	tables := `[{table: pgbench_accounts, queue: accounts}, {table: pgbench_branches, queue: branches},
      {table: pgbench_tellers, queue: tellers},
      {table: pgbench_history, queue: history, append_only: true, partition_by: [tid]},
      {table: audit, queue: audit}]`
	e := newCDCEnvOn(t, pg, pg.DSN(), "bench", tables, "snapshot: initial\nchunk_rows: 10000\nmax_bundle_messages: 5000")
	e.queue = "accounts" // the lease and pointer live under the first table's queue
	port := testenv.FreePort(t)
	raw, _ := os.ReadFile(e.config)
	cfg := strings.Replace(string(raw), "http:\n  enabled: false\n", fmt.Sprintf("http:\n  address: 127.0.0.1:%d\nmetrics:\n  prometheus: {}\n", port), 1)
	if err := os.WriteFile(e.config, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(bench, "-i", "-q", "-s", "1", pg.DSN()).CombinedOutput(); err != nil {
		t.Fatalf("pgbench -i: %v\n%s", err, out)
	}
	// pgbench picks accounts 1..100,000 at scale 1; keeping 10,000 of them leaves the load as it is
	// (an update of a missing account changes nothing) and the replay of the queue ten times shorter.
	pg.Exec(`DELETE FROM pgbench_accounts WHERE aid > 10000`)
	pg.Exec(`VACUUM ANALYZE pgbench_accounts`)
	pg.Exec(`CREATE TABLE audit (at timestamptz NOT NULL DEFAULT now(), what text)`)
	p := e.start()
	e.waitPointer()
	load := testenv.StartProcess(t, nil, bench, "-c", "2", "-j", "1", "-T", "3", pg.DSN())
	pg.Exec(`INSERT INTO audit (what) VALUES ('refused, so in no publication'); UPDATE audit SET what = 'and its UPDATE runs'`)
	if err := load.Wait(60 * time.Second); err != nil {
		t.Fatalf("pgbench: %v\n%s", err, load.Output())
	}
	t.Logf("pgbench: %s tps", pgbenchTPS(load.Output()))

	// Once the pointer covers the WAL written by then and the snapshot is done, every queue replays
	// to its table; 3 s later no queue has grown (no late duplicates).
	e.waitCovered(e.currentLSN())
	cdctest.WaitEvery(t, 90*time.Second, 100*time.Millisecond, "the snapshot to finish", func() (bool, string) {
		p := e.pointer()
		return p != nil && string(p.Snapshot) == "null", fmt.Sprintf("pointer %+v", p)
	})
	conn := e.conn()
	var inserts int
	lengths := map[string]int64{}
	for _, q := range queues {
		entries, err := oracle.ReadQueue(e.ctx, e.rd.Client(), "pgrelay", q.queue)
		if err != nil {
			t.Fatal(err)
		}
		res := oracle.Replay(entries)
		var key []string
		if q.key != "" {
			key = []string{q.key}
		} else {
			inserts = res.Events
		}
		rows, err := oracle.TableRows(e.ctx, conn, q.table, key)
		if err != nil {
			t.Fatal(err)
		}
		diffs := append(res.Problems, oracle.Compare(res.Tables[q.table], rows)...)
		for i, d := range diffs {
			if i < 10 {
				t.Error(q.queue + ": " + clip(d))
			}
		}
		if len(diffs) > 0 {
			t.Fatalf("queue %s: %d differences from %s", q.queue, len(diffs), q.table)
		}
		lengths[q.queue] = int64(len(entries))
	}
	time.Sleep(3 * time.Second)
	for _, q := range queues {
		info, err := queue.Inspect(e.ctx, e.rd.Client(), queue.NewLayout("pgrelay"), q.queue)
		if err != nil || info.Length != lengths[q.queue] {
			t.Errorf("queue %s: %d entries 3 s later, %d before (%v)", q.queue, info.Length, lengths[q.queue], err)
		}
	}
	var historyRows int
	pg.Pool().QueryRow(e.ctx, `SELECT count(*) FROM pgbench_history`).Scan(&historyRows)
	if historyRows == 0 || inserts != historyRows {
		t.Fatalf("pgbench_history: %d rows, %d events in its queue", historyRows, inserts)
	}
	t.Logf("pgbench_history: %d inserts, each once in the queue", historyRows)
	if n, _ := e.rd.Client().Exists(e.ctx, "pgrelay:{audit}:meta").Result(); n != 0 {
		t.Error("the refused table's queue exists")
	}

	// The refusal, seen where people look.
	out, err := exec.Command(testenv.Binary(t), "status", "-c", e.config, "--json").CombinedOutput()
	if err != nil {
		t.Fatalf("status: %v\n%s", err, out)
	}
	var st struct {
		Phase             string `json:"phase"`
		Epoch             string `json:"epoch"`
		Generation        int    `json:"generation"`
		LSN               string `json:"lsn"`
		LagBytes          *int64 `json:"lag_bytes"`
		InsertPublication string `json:"insert_publication"`
		Refused           []struct {
			Table, Code, Error string
		} `json:"refused_tables"`
	}
	if err := json.Unmarshal(out, &st); err != nil {
		t.Fatalf("status output: %v\n%s", err, out)
	}
	if st.Phase != "streaming" || len(st.Epoch) != 8 || st.Generation != 1 || st.LSN == "" || st.LagBytes == nil ||
		st.InsertPublication != "pgrelay_bench_insert" || len(st.Refused) != 1 || st.Refused[0].Table != "public.audit" ||
		st.Refused[0].Code != "replica_identity" || !strings.Contains(st.Refused[0].Error, "append_only: true") {
		t.Errorf("status --json: %s", out)
	}
	if !regexp.MustCompile(`public\.audit is not streamed, the other tables are \(on_refused_table: skip\): tables\[4\] \(public\.audit\): replica_identity: `).MatchString(p.Output()) {
		t.Errorf("no refusal in the log:\n%s", p.Output())
	}
	body, err := testenv.HTTPGet(e.ctx, fmt.Sprintf("http://127.0.0.1:%d/metrics", port), 5*time.Second)
	if err != nil || !regexp.MustCompile(`(?m)^pgrelay_source_table_refused\{[^}]*code="replica_identity"[^}]*table="public.audit"[^}]*\} 1$`).MatchString(body) {
		t.Errorf("metrics (%v):\n%s", err, grepLines(body, "pgrelay_source_table_refused"))
	}
}

// grepLines keeps the lines of s that contain sub.
func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
