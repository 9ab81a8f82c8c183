package source_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	_ "github.com/redpanda-data/benthos/v4/public/components/pure"
	"github.com/redpanda-data/benthos/v4/public/service"

	_ "github.com/pgrelay/pgrelay/input"
	"github.com/pgrelay/pgrelay/internal/cdctest"
	"github.com/pgrelay/pgrelay/internal/oracle"
	"github.com/pgrelay/pgrelay/internal/source"
	"github.com/pgrelay/pgrelay/internal/testenv"
	_ "github.com/pgrelay/pgrelay/output"
	"github.com/pgrelay/pgrelay/resources"
)

type env struct {
	t   testing.TB
	pg  *testenv.Postgres
	rd  *testenv.Redis
	ctx context.Context
}

// newEnv starts the test's own PostgreSQL and Redis. The test runs in parallel with the package's
// other tests on servers of their own (go test -parallel, GOMAXPROCS by default): most of its time is
// spent waiting on the servers and the pipeline.
func newEnv(t *testing.T) *env {
	t.Parallel()
	return &env{t: t, pg: testenv.StartPostgres(t), rd: testenv.StartRedis(t), ctx: context.Background()}
}

// run starts pg_cdc → redis_queue with the given tables block and extra pg_cdc fields.
func (e *env) run(name, tables, extra string) func() {
	e.t.Helper()
	return startStream(e.t, cdctest.Pipeline{Name: name, DSN: e.pg.DSN(), Tables: tables, Redis: e.rd.URL(), Source: extra}.YAML())
}

// startStream runs a pipeline until the returned stop (or the test's end).
func startStream(tb testing.TB, yaml string) func() { return runStream(tb, yaml, nil) }

// runStream is startStream with the pipeline's logs going to logger (nil: Benthos' own logger).
func runStream(tb testing.TB, yaml string, logger *slog.Logger) func() {
	b := service.NewStreamBuilder()
	if err := b.SetYAML(yaml); err != nil {
		tb.Fatal(err)
	}
	if logger != nil {
		b.SetLogger(logger)
	}
	stream, err := b.Build()
	if err != nil {
		tb.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := stream.Run(context.Background()); err != nil {
			tb.Logf("stream: %v", err)
		}
	}()
	stopped := false
	stop := func() {
		if !stopped {
			stopped = true
			cdctest.StopAndWait(tb, stream, done, 20*time.Second)
		}
	}
	tb.Cleanup(stop)
	return stop
}

// indent indents a block of pg_cdc fields under `pg_cdc:`.
func indent(s string) string { return strings.TrimSuffix(cdctest.Indent(s, "    "), "\n") }

// waitPointer waits until the source's pointer exists (the slot was created).
func (e *env) waitPointer(name, queue string) {
	e.t.Helper()
	key := cdctest.SourceKey(queue, name, "ptr")
	cdctest.Wait(e.t, 30*time.Second, "the pointer "+key, func() (bool, string) {
		return e.rd.Client().Exists(e.ctx, key).Val() == 1, "no pointer"
	})
}

// waitEntries waits until queue holds at least n entries and returns them.
func (e *env) waitEntries(queue string, n int) []oracle.Entry {
	e.t.Helper()
	var got []oracle.Entry
	cdctest.Wait(e.t, 30*time.Second, fmt.Sprintf("%d entries in queue %s", n, queue), func() (bool, string) {
		var err error
		if got, err = oracle.ReadQueue(e.ctx, e.rd.Client(), "pgrelay", queue); err != nil {
			e.t.Fatal(err)
		}
		return len(got) >= n, fmt.Sprintf("%d entries", len(got))
	})
	return got
}

func (e *env) conn() *pgx.Conn { return cdctest.Conn(e.t, e.pg.DSN()) }

// checkOracle replays queue and compares it with table.
func (e *env) checkOracle(queue, table string, key ...string) {
	e.t.Helper()
	entries, err := oracle.ReadQueue(e.ctx, e.rd.Client(), "pgrelay", queue)
	if err != nil {
		e.t.Fatal(err)
	}
	res := oracle.Replay(entries)
	for _, p := range res.Problems {
		e.t.Error(p)
	}
	rows, err := oracle.TableRows(e.ctx, e.conn(), table, key)
	if err != nil {
		e.t.Fatal(err)
	}
	for _, d := range oracle.Compare(res.Tables[table], rows) {
		e.t.Error(d)
	}
}

func event(t *testing.T, en oracle.Entry) map[string]json.RawMessage {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(en.Payload, &m); err != nil {
		t.Fatal(err)
	}
	return m
}

// sortByTx orders entries of several shards by commit lsn then seq (their id).
func byID(entries []oracle.Entry) map[string]oracle.Entry {
	out := map[string]oracle.Entry{}
	for _, e := range entries {
		out[e.ID] = e
	}
	return out
}

func TestWalkthrough(t *testing.T) {
	e := newEnv(t)
	e.pg.Exec(`CREATE TABLE t (id int PRIMARY KEY, v text, n numeric, big text);
		ALTER TABLE t ALTER COLUMN big SET STORAGE EXTERNAL`)
	e.run("walk", `[{table: t, queue: q}]`, "")
	e.waitPointer("walk", "q")
	big := strings.Repeat("0123456789", 10000)
	e.pg.Exec(`INSERT INTO t VALUES (1, 'a', 123456789012345678901234567890, $1)`, big)
	e.pg.Exec(`UPDATE t SET v = 'b' WHERE id = 1`)
	e.pg.Exec(`BEGIN; INSERT INTO t VALUES (2, 'x', -1.5, NULL); DELETE FROM t WHERE id = 1; COMMIT`)
	e.pg.Exec(`INSERT INTO t VALUES (5, 'toast', 0, $1)`, big)
	e.pg.Exec(`UPDATE t SET id = 3 WHERE id = 2`)
	e.pg.Exec(`UPDATE t SET id = 6 WHERE id = 5`)
	entries := e.waitEntries("q", 9)
	if len(entries) != 9 {
		t.Fatalf("%d entries, want 9", len(entries))
	}
	var ins, upd, ins2, del []oracle.Entry
	for _, en := range entries {
		ev := event(t, en)
		switch {
		case string(ev["op"]) == `"c"` && string(ev["key"]) == `{"id":1}`:
			ins = append(ins, en)
		case string(ev["op"]) == `"u"`:
			upd = append(upd, en)
		case string(ev["op"]) == `"c"` && string(ev["key"]) == `{"id":2}`:
			ins2 = append(ins2, en)
		case string(ev["op"]) == `"d"` && string(ev["key"]) == `{"id":1}`:
			del = append(del, en)
		}
	}
	if len(ins) != 1 || len(upd) != 1 || len(ins2) != 1 || len(del) != 1 {
		t.Fatalf("unexpected events: %d %d %d %d", len(ins), len(upd), len(ins2), len(del))
	}
	// The update left the TOASTed column out and listed it.
	u := event(t, upd[0])
	if string(u["unchanged"]) != `["big"]` || string(u["after"]) != `{"id":1,"v":"b","n":123456789012345678901234567890}` || string(u["before"]) != "null" {
		t.Errorf("update event: %s", upd[0].Payload)
	}
	if !strings.HasPrefix(string(ins[0].Payload), `{"op":"c","table":"public.t","key":{"id":1},"after":{"id":1,"v":"a","n":123456789012345678901234567890,"big":"0123`) {
		t.Errorf("insert event: %.200s", ins[0].Payload)
	}
	// Insert and delete of one transaction: same lsn, xid and tx, seq 0 and 1.
	a, d := event(t, ins2[0]), event(t, del[0])
	if string(a["lsn"]) != string(d["lsn"]) || string(a["xid"]) != string(d["xid"]) || ins2[0].Tx != del[0].Tx ||
		string(a["seq"]) != "0" || string(d["seq"]) != "1" {
		t.Errorf("one transaction: %s / %s", ins2[0].Payload, del[0].Payload)
	}
	if string(d["before"]) != `{"id":1}` || string(d["after"]) != "null" {
		t.Errorf("delete: %s", del[0].Payload)
	}
	// Key changes: d to the old partition, then c (id .1) to the new one, the TOAST value read back.
	ids := byID(entries)
	var moves int
	for id, en := range ids {
		if !strings.HasSuffix(id, ".1") {
			continue
		}
		moves++
		c := event(t, en)
		dEntry, ok := ids[strings.TrimSuffix(id, ".1")]
		if !ok {
			t.Fatalf("no d for %s", id)
		}
		dd := event(t, dEntry)
		if string(dd["op"]) != `"d"` || string(c["op"]) != `"c"` || dEntry.Partition == en.Partition {
			t.Errorf("key change: %s / %s", dEntry.Payload, en.Payload)
		}
		if string(c["key"]) == `{"id":6}` && !strings.Contains(string(c["after"]), `"big":"0123`) {
			t.Errorf("key change of a TOASTed row lost the value: %.300s", en.Payload)
		}
		if _, listed := c["unchanged"]; listed {
			t.Errorf("c of a key change lists unchanged: %.300s", en.Payload)
		}
	}
	if moves != 2 {
		t.Errorf("%d key changes, want 2", moves)
	}
	e.checkOracle("q", "public.t", "id")
}

func TestOutOfOrderCommitArrivesInCommitOrder(t *testing.T) {
	e := newEnv(t)
	e.pg.Exec(`CREATE TABLE s (id int PRIMARY KEY, v text)`)
	e.run("ooo", `[{table: s, queue: q, partition_by: single}]`, "")
	e.waitPointer("ooo", "q")
	t1, err := e.pg.Pool().Begin(e.ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := t1.Exec(e.ctx, `INSERT INTO s VALUES (1, 'T1')`); err != nil {
		t.Fatal(err)
	}
	e.pg.Exec(`INSERT INTO s VALUES (2, 'T2')`)
	if err := t1.Commit(e.ctx); err != nil {
		t.Fatal(err)
	}
	entries := e.waitEntries("q", 2)
	if len(entries) != 2 || entries[0].Partition != "all" {
		t.Fatalf("entries: %+v", entries)
	}
	if !strings.Contains(string(entries[0].Payload), `"T2"`) || !strings.Contains(string(entries[1].Payload), `"T1"`) {
		t.Errorf("not in commit order: %s then %s", entries[0].Payload, entries[1].Payload)
	}
	e.checkOracle("q", "public.s", "id")
}

func TestDroppedSlotIsSlotLostAndNotRecreated(t *testing.T) {
	e := newEnv(t)
	e.pg.Exec(`CREATE TABLE s (id int PRIMARY KEY)`)
	stop := e.run("lost", `[{table: s, queue: q}]`, "")
	e.waitPointer("lost", "q")
	e.pg.Exec(`INSERT INTO s VALUES (1)`)
	e.waitEntries("q", 1)
	stop()
	e.pg.DropSlot("pgrelay_lost")
	e.run("lost", `[{table: s, queue: q}]`, "")
	e.waitStatus("q", "lost", `"code":"slot_lost"`)
	for i := 0; i < 20; i++ {
		var n int
		if err := e.pg.Pool().QueryRow(e.ctx, `SELECT count(*) FROM pg_replication_slots WHERE slot_name = 'pgrelay_lost'`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n != 0 {
			t.Fatal("the slot was recreated")
		}
		time.Sleep(150 * time.Millisecond)
	}
}

func TestReplicaIdentityFullUsingIndexPartitionColumnsAndTruncate(t *testing.T) {
	e := newEnv(t)
	e.pg.Exec(`CREATE TABLE f (id int PRIMARY KEY, grp text, v text);
		ALTER TABLE f REPLICA IDENTITY FULL;
		CREATE TABLE ix (id int NOT NULL, code text NOT NULL, v text);
		CREATE UNIQUE INDEX ix_code ON ix (code);
		ALTER TABLE ix REPLICA IDENTITY USING INDEX ix_code;
		CREATE TABLE s (id int PRIMARY KEY, v text)`)
	e.run("ident", `[{table: f, queue: qf, partition_by: [grp]}, {table: ix, queue: qi}]`, "")
	e.run("trunc", `[{table: s, queue: qs, partition_by: single}]`, "truncate: emit")
	e.waitPointer("ident", "qf")
	e.waitPointer("trunc", "qs")
	e.pg.Exec(`INSERT INTO f VALUES (1, 'a|b', 'one')`)
	e.pg.Exec(`UPDATE f SET v = 'two' WHERE id = 1`)
	e.pg.Exec(`UPDATE f SET grp = 'c' WHERE id = 1`)
	e.pg.Exec(`DELETE FROM f WHERE id = 1`)
	e.pg.Exec(`INSERT INTO ix VALUES (1, 'k1', 'x')`)
	e.pg.Exec(`UPDATE ix SET v = 'y' WHERE code = 'k1'`)
	e.pg.Exec(`UPDATE ix SET code = 'k2' WHERE code = 'k1'`)
	e.pg.Exec(`INSERT INTO s VALUES (1, 'x')`)
	e.pg.Exec(`TRUNCATE s`)
	f := e.waitEntries("qf", 5)
	var got []string
	for _, en := range f {
		got = append(got, en.Partition+" "+string(en.Payload[:strings.Index(string(en.Payload), `,"lsn"`)]))
	}
	want := []string{
		`a|b {"op":"c","table":"public.f","key":{"id":1},"after":{"id":1,"grp":"a|b","v":"one"},"before":null`,
		`a|b {"op":"u","table":"public.f","key":{"id":1},"after":{"id":1,"grp":"a|b","v":"two"},"before":{"id":1,"grp":"a|b","v":"one"}`,
		`a|b {"op":"d","table":"public.f","key":{"id":1},"after":null,"before":{"id":1,"grp":"a|b","v":"two"}`,
	}
	// Partitions a|b and c may be on different shards: compare per partition.
	var ab, c []string
	for _, g := range got {
		if strings.HasPrefix(g, "a|b ") {
			ab = append(ab, g)
		} else {
			c = append(c, g)
		}
	}
	if strings.Join(ab, "\n") != strings.Join(want, "\n") {
		t.Errorf("partition a|b:\n%s\nwant\n%s", strings.Join(ab, "\n"), strings.Join(want, "\n"))
	}
	wantC := []string{
		`c {"op":"c","table":"public.f","key":{"id":1},"after":{"id":1,"grp":"c","v":"two"},"before":null`,
		`c {"op":"d","table":"public.f","key":{"id":1},"after":null,"before":{"id":1,"grp":"c","v":"two"}`,
	}
	if strings.Join(c, "\n") != strings.Join(wantC, "\n") {
		t.Errorf("partition c:\n%s\nwant\n%s", strings.Join(c, "\n"), strings.Join(wantC, "\n"))
	}
	ix := e.waitEntries("qi", 4)
	var ops []string
	for _, en := range ix {
		ev := event(t, en)
		ops = append(ops, en.Partition+":"+string(ev["op"])+string(ev["key"])+string(ev["before"]))
	}
	joined := strings.Join(ops, " ")
	for _, w := range []string{`k1:"c"{"code":"k1"}null`, `k1:"u"{"code":"k1"}null`, `k1:"d"{"code":"k1"}{"code":"k1"}`, `k2:"c"{"code":"k2"}null`} {
		if !strings.Contains(joined, w) {
			t.Errorf("USING INDEX events %s lack %s", joined, w)
		}
	}
	sq := e.waitEntries("qs", 2)
	if len(sq) != 2 || !strings.HasPrefix(string(sq[1].Payload), `{"op":"t","table":"public.s","key":null,"after":null,"before":null,"lsn":`) || sq[1].Partition != "all" {
		t.Errorf("truncate: %s", sq[len(sq)-1].Payload)
	}
	e.checkOracle("qi", "public.ix", "code")
}

// opCounts counts queue's entries by op and table ("c public.t": 3).
func (e *env) opCounts(queue string) map[string]int {
	e.t.Helper()
	entries, err := oracle.ReadQueue(e.ctx, e.rd.Client(), "pgrelay", queue)
	if err != nil {
		e.t.Fatal(err)
	}
	n := map[string]int{}
	for _, en := range entries {
		var ev struct{ Op, Table string }
		if json.Unmarshal(en.Payload, &ev) == nil {
			n[ev.Op+" "+ev.Table]++
		}
	}
	return n
}

// waitStatus waits until the source's status hash shows want (a phase or an error code).
func (e *env) waitStatus(queue, name, want string) {
	e.t.Helper()
	cdctest.WaitStatus(e.t, 30*time.Second, e.rd.Client(), queue, name, want)
}

// TestStatusEntriesRefreshedAndPruned: a replica that stays in one phase writes its status entry
// again (a later `at`) so neither its entry nor the hash expires while it runs (the hash's TTL is
// set again to a day), and the entries of replicas that wrote none for a day, or that cannot be
// read, are dropped; a recent entry of another replica stays.
func TestStatusEntriesRefreshedAndPruned(t *testing.T) {
	old := source.SetStatusRefresh(300 * time.Millisecond)
	defer source.SetStatusRefresh(old)
	e := newEnv(t)
	e.pg.Exec(`CREATE TABLE st (id int PRIMARY KEY)`)
	key := cdctest.SourceKey("q", "st", "status")
	rdb := e.rd.Client()
	stale := fmt.Sprintf(`{"phase":"stopped","error":"","code":"","at":%q}`, time.Now().Add(-25*time.Hour).UTC().Format(time.RFC3339))
	recent := fmt.Sprintf(`{"phase":"stopped","error":"","code":"","at":%q}`, time.Now().Add(-time.Hour).UTC().Format(time.RFC3339))
	rdb.HSet(e.ctx, key, "gone:1:00000000", stale, "recent:2:00000000", recent, "garbled:3:00000000", "not json")
	stop := e.run("st", `[{table: st, queue: q}]`, "")
	defer stop()
	e.waitStatus("q", "st", `"phase":"streaming"`)
	ownAt := func() (string, string) {
		all, _ := rdb.HGetAll(e.ctx, key).Result()
		for owner, v := range all {
			var st source.ReplicaStatus
			if json.Unmarshal([]byte(v), &st) == nil && st.Phase == source.PhaseStreaming {
				return owner, st.At
			}
		}
		return "", ""
	}
	owner, first := ownAt()
	rdb.PExpire(e.ctx, key, time.Minute) // as if the last write were a day ago, less a minute
	cdctest.Wait(t, 10*time.Second, "the entry written again, the stale ones dropped", func() (bool, string) {
		o, at := ownAt()
		all, _ := rdb.HGetAll(e.ctx, key).Result()
		ttl, _ := rdb.PTTL(e.ctx, key).Result()
		_, hasGone := all["gone:1:00000000"]
		_, hasGarbled := all["garbled:3:00000000"]
		_, hasRecent := all["recent:2:00000000"]
		return o == owner && at > first && !hasGone && !hasGarbled && hasRecent && ttl > 23*time.Hour,
			fmt.Sprintf("owner %s at %s (first %s), ttl %v, entries %v", o, at, first, ttl, all)
	})
}

// TestConnectionFailuresGetCodes: a source whose PostgreSQL does not answer reports
// pg_unreachable with the address and stays in phase connecting (the server may come back: it
// retries), while a database that does not exist (pg_database), a server whose every replication
// slot is taken (pg_limit) and a standby (pg_read_only) put it in phase error (the user must act);
// each in the status `pgrelay status` reads.
func TestConnectionFailuresGetCodes(t *testing.T) {
	e := newEnv(t)
	closed := testenv.FreePort(t)
	startStream(t, cdctest.Pipeline{Name: "gone", DSN: fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres", closed), Tables: `[{table: t, queue: q}]`,
		Redis: e.rd.URL()}.YAML())
	e.waitStatus("q", "gone", fmt.Sprintf(`"phase":"connecting","error":"pg_unreachable: PostgreSQL does not answer at 127.0.0.1:%d`, closed))
	e.waitStatus("q", "gone", `"code":"pg_unreachable"`)
	startStream(t, cdctest.Pipeline{Name: "nodb", DSN: e.pg.DatabaseDSN("nodb"), Tables: `[{table: t, queue: q}]`, Redis: e.rd.URL()}.YAML())
	e.waitStatus("q", "nodb", `"phase":"error","error":"pg_database: database nodb does not exist`)
	full := testenv.StartPostgres(t, testenv.WithPGSetting("max_replication_slots = 1"))
	full.Exec(`CREATE TABLE t (id int PRIMARY KEY)`)
	full.Exec(`SELECT pg_create_logical_replication_slot('other', 'pgoutput')`)
	startStream(t, cdctest.Pipeline{Name: "noslot", DSN: full.DSN(), Tables: `[{table: t, queue: q}]`, Redis: e.rd.URL()}.YAML())
	e.waitStatus("q", "noslot", `"phase":"error","error":"pg_limit: every replication slot PostgreSQL allows is in use (max_replication_slots)`)
	standby := testenv.StartStandby(t, e.pg)
	startStream(t, cdctest.Pipeline{Name: "replica", DSN: standby.DSN(), Tables: `[{table: t, queue: q}]`, Redis: e.rd.URL()}.YAML())
	e.waitStatus("q", "replica", `"phase":"error","error":"pg_read_only: PostgreSQL takes no writes here: a standby`)
}

func TestStartChecksFailWithCodes(t *testing.T) {
	e := newEnv(t)
	filters := e.pg.Version >= 15 // row filters and column lists came with PostgreSQL 15
	e.pg.Exec(`CREATE TABLE s (id int PRIMARY KEY, v text);
		CREATE TABLE nokey (v text);
		CREATE TABLE other (id int PRIMARY KEY)`)
	if filters {
		e.pg.Exec(`CREATE PUBLICATION filtered FOR TABLE s WHERE (id > 0)`)
	}
	// A table without a key: refused before any publication exists.
	stop := e.run("nokey", `[{table: nokey, queue: q1}]`, "")
	e.waitStatus("q1", "nokey", `"code":"replica_identity"`)
	stop()
	var pubs int
	e.pg.Pool().QueryRow(e.ctx, `SELECT count(*) FROM pg_publication WHERE pubname = 'pgrelay_nokey'`).Scan(&pubs)
	if pubs != 0 {
		t.Error("the publication was created although a table failed its check")
	}
	// An unmanaged publication with a row filter.
	if filters {
		stop = e.run("filt", `[{table: s, queue: q2}]`, "publication: {name: filtered, manage: false}")
		e.waitStatus("q2", "filt", `"code":"publication"`)
		stop()
	}
	// A managed publication with a filter (15+) and an extra table is corrected.
	if filters {
		e.pg.Exec(`CREATE PUBLICATION pgrelay_fix FOR TABLE s WHERE (id > 5), other`)
	} else {
		e.pg.Exec(`CREATE PUBLICATION pgrelay_fix FOR TABLE s, other`)
	}
	stop = e.run("fix", `[{table: s, queue: q3}]`, "")
	e.waitStatus("q3", "fix", `"phase":"streaming"`)
	stop()
	var tables int
	var filtered bool
	filterExpr := "false"
	if filters {
		filterExpr = "prqual IS NOT NULL"
	}
	e.pg.Pool().QueryRow(e.ctx, `SELECT count(*), bool_or(`+filterExpr+`) FROM pg_publication_rel r
		JOIN pg_publication p ON p.oid = r.prpubid WHERE p.pubname = 'pgrelay_fix'`).Scan(&tables, &filtered)
	if tables != 1 || filtered {
		t.Errorf("managed publication not corrected: %d tables, filtered %v", tables, filtered)
	}
	// A corrupt pointer.
	e.rd.Client().Set(e.ctx, "pgrelay:{q3}:src:fix:ptr", "not json", 0)
	stop = e.run("fix", `[{table: s, queue: q3}]`, "")
	e.waitStatus("q3", "fix", `"code":"pointer_corrupt"`)
	stop()
	// A slot consumed past the pointer.
	stop = e.run("ahead", `[{table: s, queue: q4}]`, "")
	e.waitPointer("ahead", "q4")
	stop()
	e.pg.Exec(`INSERT INTO s VALUES (1, 'x')`)
	for i := 0; ; i++ { // the walsender of the stopped source may take a moment to exit
		_, err := e.pg.Pool().Exec(e.ctx, `SELECT pg_replication_slot_advance('pgrelay_ahead', pg_current_wal_lsn())`)
		if err == nil {
			break
		}
		if i == 100 {
			t.Fatal(err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	stop = e.run("ahead", `[{table: s, queue: q4}]`, "")
	e.waitStatus("q4", "ahead", `"code":"slot_ahead"`)
	stop()
}

func TestSlotInUseWaitsForIt(t *testing.T) {
	e := newEnv(t)
	e.pg.Exec(`CREATE TABLE s (id int PRIMARY KEY)`)
	e.pg.Exec(`SELECT pg_create_logical_replication_slot('pgrelay_busy', 'pgoutput')`)
	cfg, _ := pgconn.ParseConfig(e.pg.DSN() + "&replication=database")
	holder, err := pgconn.ConnectConfig(e.ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	e.pg.Exec(`CREATE PUBLICATION holder FOR TABLE s`)
	if err := pglogrepl.StartReplication(e.ctx, holder, "pgrelay_busy", 0, pglogrepl.StartReplicationOptions{
		PluginArgs: []string{"proto_version '1'", "publication_names 'holder'"}}); err != nil {
		t.Fatal(err)
	}
	e.run("busy", `[{table: s, queue: q}]`, "")
	e.waitStatus("q", "busy", `"phase":"waiting_for_slot"`)
	holder.Close(e.ctx)
	e.waitStatus("q", "busy", `"phase":"streaming"`)
	e.pg.Exec(`INSERT INTO s VALUES (1)`)
	e.waitEntries("q", 1)
	e.checkOracle("q", "public.s", "id")
}

func TestPublishedMessagesArriveWithTheirTransaction(t *testing.T) {
	e := newEnv(t)
	e.pg.Exec(resources.MustRead("source_publish.sql"))
	e.pg.Exec(`CREATE TABLE s (id int PRIMARY KEY)`)
	e.run("pub", `[{table: s, queue: q}]`, "")
	e.waitPointer("pub", "q")
	e.pg.Exec(`BEGIN; INSERT INTO s VALUES (1); SELECT pgrelay.publish('events', 'cust-7', '{"a": [1, 12345678901234567890]}'); COMMIT`)
	e.pg.Exec(`BEGIN; SELECT pgrelay.publish('events', 'cust-7', '{"gone": true}'); ROLLBACK`)
	e.pg.Exec(`SELECT pgrelay.publish('events', 'cust-8', '"alone"')`)
	rows := e.waitEntries("q", 1)
	msgs := e.waitEntries("events", 2)
	time.Sleep(500 * time.Millisecond)
	msgs = e.waitEntries("events", 2)
	if len(msgs) != 2 {
		t.Fatalf("%d published messages, want 2", len(msgs))
	}
	var first, second oracle.Entry
	for _, m := range msgs {
		if m.Partition == "cust-7" {
			first = m
		} else {
			second = m
		}
	}
	ev, row := event(t, first), event(t, rows[0])
	if string(ev["op"]) != `"m"` || string(ev["after"]) != `{"a": [1, 12345678901234567890]}` || string(ev["seq"]) != "1" ||
		string(ev["lsn"]) != string(row["lsn"]) || first.Tx != rows[0].Tx {
		t.Errorf("published message: %s (row %s)", first.Payload, rows[0].Payload)
	}
	if !strings.Contains(string(second.Payload), `"after":"alone"`) || second.Partition != "cust-8" {
		t.Errorf("second message: %s in %s", second.Payload, second.Partition)
	}
}

// TestSlowOutputNeverTimesOutTheWalsender holds every batch in the pipeline for longer than
// wal_sender_timeout: the reader, blocked on the full queue, still reports its position, so the
// replication connection survives (one walsender pid throughout) and every row arrives.
func TestSlowOutputNeverTimesOutTheWalsender(t *testing.T) {
	e := &env{t: t, pg: testenv.StartPostgres(t, testenv.WithPGSetting("wal_sender_timeout = 2s")), rd: testenv.StartRedis(t), ctx: context.Background()}
	e.pg.Exec(`CREATE TABLE s (id int PRIMARY KEY)`)
	yaml := fmt.Sprintf(`
input:
  pg_cdc:
    name: slow
    dsn: %s
    tls: {mode: disable}
    tables: [{table: s, queue: q}]
    redis: {url: %s}
    max_bundle_messages: 1
pipeline:
  processors:
    - sleep: {duration: 2500ms}
output:
  redis_queue:
    url: %s
logger:
  level: warn
`, e.pg.DSN(), e.rd.URL(), e.rd.URL())
	startStream(t, yaml)
	e.waitPointer("slow", "q")
	for i := 1; i <= 3; i++ {
		e.pg.Exec(`INSERT INTO s VALUES ($1)`, i)
	}
	pids := map[int]bool{}
	cdctest.WaitEvery(t, 60*time.Second, 100*time.Millisecond, "3 rows in the queue", func() (bool, string) {
		var pid *int
		e.pg.Pool().QueryRow(e.ctx, `SELECT active_pid FROM pg_replication_slots WHERE slot_name = 'pgrelay_slow'`).Scan(&pid)
		if pid != nil {
			pids[*pid] = true
		}
		entries, _ := oracle.ReadQueue(e.ctx, e.rd.Client(), "pgrelay", "q")
		return len(entries) == 3, fmt.Sprintf("%d of 3 rows", len(entries))
	})
	if len(pids) != 1 {
		t.Errorf("the walsender changed %d times: %v", len(pids)-1, pids)
	}
	e.checkOracle("q", "public.s", "id")
}

func TestInvalidatedSlotIsSlotInvalidated(t *testing.T) {
	t.Parallel()
	e := &env{t: t, pg: testenv.StartPostgres(t, testenv.WithPGSetting("max_slot_wal_keep_size = 1MB"),
		testenv.WithPGSetting("min_wal_size = 32MB"), testenv.WithPGSetting("max_wal_size = 32MB")),
		rd: testenv.StartRedis(t), ctx: context.Background()}
	e.pg.Exec(`CREATE TABLE s (id int PRIMARY KEY, v text)`)
	stop := e.run("inv", `[{table: s, queue: q}]`, "")
	e.waitPointer("inv", "q")
	stop()
	for i := 0; i < 6; i++ {
		e.pg.Exec(`INSERT INTO s SELECT g, repeat('x', 100) FROM generate_series($1::int, $1::int + 20000) g ON CONFLICT DO NOTHING`, i*20001)
		e.pg.Exec(`SELECT pg_switch_wal()`)
		e.pg.Exec(`CHECKPOINT`)
	}
	var status *string
	e.pg.Pool().QueryRow(e.ctx, `SELECT wal_status FROM pg_replication_slots WHERE slot_name = 'pgrelay_inv'`).Scan(&status)
	if status == nil || *status != "lost" {
		t.Skipf("the slot was not invalidated (wal_status %v)", status)
	}
	e.run("inv", `[{table: s, queue: q}]`, "")
	e.waitStatus("q", "inv", `"code":"slot_invalidated"`)
}

func TestPointerOfAnotherSystemOrSlotIsRefused(t *testing.T) {
	e := newEnv(t)
	e.pg.Exec(`CREATE TABLE s (id int PRIMARY KEY)`)
	stop := e.run("sys", `[{table: s, queue: q}]`, "")
	e.waitPointer("sys", "q")
	stop()
	key := "pgrelay:{q}:src:sys:ptr"
	orig, _ := e.rd.Client().Get(e.ctx, key).Result()
	for _, c := range []struct{ field, value, code string }{
		{"system_id", "1234", "system_changed"},
		{"slot", "pgrelay_other", "slot_mismatch"},
	} {
		var m map[string]any
		json.Unmarshal([]byte(orig), &m)
		m[c.field] = c.value
		b, _ := json.Marshal(m)
		e.rd.Client().Set(e.ctx, key, b, 0)
		e.rd.Client().Del(e.ctx, "pgrelay:{q}:src:sys:status")
		stop := e.run("sys", `[{table: s, queue: q}]`, "")
		e.waitStatus("q", "sys", `"code":"`+c.code+`"`)
		stop()
	}
}

// TestLoadLingerKeepsEveryChangeOnce streams from 4 writers flat out with a long load_linger (the
// batches wait to fill and the reader leaves the WAL unread meanwhile), stopping and restarting
// the pipeline in the middle: the queue replays to exactly the table.
func TestLoadLingerKeepsEveryChangeOnce(t *testing.T) {
	e := newEnv(t)
	e.pg.Exec(`CREATE TABLE s (id int PRIMARY KEY, v int NOT NULL)`)
	stop := e.run("fill", `[{table: s, queue: q}]`, "load_linger: 40ms")
	e.waitPointer("fill", "q")
	const writers, each = 4, 300
	var wg sync.WaitGroup
	var mu sync.Mutex
	progress := 0
	for w := 0; w < writers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := e.conn()
			for i := 0; i < each; i++ {
				id := w*each + i
				if _, err := c.Exec(e.ctx, `INSERT INTO s VALUES ($1, 0)`, id); err != nil {
					t.Error(err)
					return
				}
				if i%2 == 1 {
					if _, err := c.Exec(e.ctx, `UPDATE s SET v = v + 1 WHERE id = $1`, id-1); err != nil {
						t.Error(err)
						return
					}
				}
				mu.Lock()
				progress++
				mu.Unlock()
			}
		}()
	}
	cdctest.Wait(t, 60*time.Second, "the writers halfway", func() (bool, string) {
		mu.Lock()
		defer mu.Unlock()
		return progress >= writers*each/2, fmt.Sprint(progress)
	})
	stop() // mid-stream, batches waiting to fill
	e.run("fill", `[{table: s, queue: q}]`, "load_linger: 40ms")
	wg.Wait()
	e.waitEntries("q", writers*each*3/2)
	time.Sleep(300 * time.Millisecond) // anything beyond would be a duplicate
	e.checkOracle("q", "public.s", "id")
}
