package tests

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgrelay/pgrelay/internal/cdctest"
	"github.com/pgrelay/pgrelay/internal/oracle"
	"github.com/pgrelay/pgrelay/internal/queue"
	"github.com/pgrelay/pgrelay/internal/testenv"
)

// rtTable is the round trip's table, created the same way in database A (the source) and in every
// copy: jsonb, 30-digit numerics, bigints past 2^53, text arrays with NULL/commas/quotes/braces and a
// 20–40 kB text stored out of line without compression (STORAGE EXTERNAL), so updates that do not
// touch it arrive with it listed in `unchanged`.
const rtTable = `
CREATE TABLE rt (
  id     bigint PRIMARY KEY,
  doc    jsonb,
  amount numeric,
  big    bigint,
  tags   text[],
  body   text,
  n      int NOT NULL DEFAULT 0,
  ts     timestamptz NOT NULL DEFAULT now()
);
ALTER TABLE rt ALTER COLUMN body SET STORAGE EXTERNAL;`

// roundTrip is database A streaming into queue q (pg_cdc → redis_queue, one pgrelay process) and
// the sink pipelines that copy q into other databases (redis_queue → pg_sink cdc, one process each).
type roundTrip struct {
	*cdcEnv
	pools  map[string]*pgxpool.Pool // database name → pool
	source *testenv.Process         // the pg_cdc → redis_queue process
}

// newRoundTrip creates table rt in A, starts the source process and waits for its pointer.
func newRoundTrip(t *testing.T, name string) *roundTrip {
	t.Helper()
	e := newCDCEnv(t, name, `[{table: public.rt, queue: q}]`, "")
	e.pg.Exec(rtTable)
	rt := &roundTrip{cdcEnv: e, pools: map[string]*pgxpool.Pool{}}
	rt.source = e.start()
	e.waitPointer()
	return rt
}

// database creates database db with an empty rt table and returns its DSN.
func (rt *roundTrip) database(db string) string {
	rt.t.Helper()
	dsn := rt.pg.CreateDatabase(db)
	pool, err := pgxpool.New(rt.ctx, dsn)
	if err != nil {
		rt.t.Fatal(err)
	}
	rt.t.Cleanup(pool.Close)
	if _, err := pool.Exec(rt.ctx, rtTable); err != nil {
		rt.t.Fatal(err)
	}
	rt.pools[db] = pool
	return dsn
}

// sinkConfig is a redis_queue → pg_sink (mode cdc) pipeline copying q into table rt of dsn.
func (rt *roundTrip) sinkConfig(dsn, sinkName, group string) string {
	return sinkPipeline{redisURL: rt.rd.URL(), queue: "q", group: group, dsn: dsn, sink: sinkName, table: "public.rt",
		mode: "cdc", batchCount: 64, maxAttempts: 3}.YAML()
}

// rowHashes reads md5(row_to_json(t)::text) of every row of rt, by id.
func rowHashes(ctx context.Context, pool *pgxpool.Pool) (map[int64]string, error) {
	return tableHashes(ctx, pool, "rt", "id")
}

// tableHashes reads md5(row_to_json(t)::text) of every row of table, by its bigint-compatible key
// column.
func tableHashes(ctx context.Context, pool *pgxpool.Pool, table, key string) (map[int64]string, error) {
	rows, err := pool.Query(ctx, `SELECT `+pgx.Identifier{key}.Sanitize()+`::bigint, md5(row_to_json(t)::text) FROM `+
		pgx.Identifier(strings.Split(table, ".")).Sanitize()+` t`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[int64]string{}
	for rows.Next() {
		var id int64
		var h string
		if err := rows.Scan(&id, &h); err != nil {
			return nil, err
		}
		out[id] = h
	}
	return out, rows.Err()
}

// hashDiff lists the ids whose rows differ between want and got (at most 10).
func hashDiff(want, got map[int64]string) []string {
	var d []string
	for id, h := range want {
		if g, ok := got[id]; !ok {
			d = append(d, fmt.Sprintf("id %d missing", id))
		} else if g != h {
			d = append(d, fmt.Sprintf("id %d differs", id))
		}
	}
	for id := range got {
		if _, ok := want[id]; !ok {
			d = append(d, fmt.Sprintf("id %d extra", id))
		}
	}
	sort.Strings(d)
	if len(d) > 10 {
		d = append(d[:10], fmt.Sprintf("... %d differences", len(d)))
	}
	return d
}

// sameRows compares rt of A with rt of database db, row by row.
func (rt *roundTrip) sameRows(db string) (bool, string) {
	want, err := rowHashes(rt.ctx, rt.pg.Pool())
	if err != nil {
		return false, err.Error()
	}
	got, err := rowHashes(rt.ctx, rt.pools[db])
	if err != nil {
		return false, err.Error()
	}
	d := hashDiff(want, got)
	return len(d) == 0, fmt.Sprintf("A has %d rows, %s %d: %s", len(want), db, len(got), strings.Join(d, "; "))
}

// waitCaughtUp waits until group has read and acked the whole queue and rt in db equals rt in A; on
// timeout it explains the differing rows.
func (rt *roundTrip) waitCaughtUp(db, group string, p *testenv.Process, d time.Duration) {
	rt.t.Helper()
	ok, state := cdctest.Poll(d, 250*time.Millisecond, func() (bool, string) { return rt.caughtUp(db, group) })
	if ok {
		return
	}
	rt.explainDiff(db)
	rt.t.Fatalf("timed out waiting for %s equal to A (last state: %s; output: %s)", db, state, sinkLastLines(p.Output(), 5))
}

func (rt *roundTrip) caughtUp(db, group string) (bool, string) {
	info, err := queue.Inspect(rt.ctx, rt.rd.Client(), queue.NewLayout("pgrelay"), "q")
	if err != nil {
		return false, err.Error()
	}
	for _, g := range info.Groups {
		if g.Name == group && (g.Lag > 0 || g.Pending > 0) {
			return false, fmt.Sprintf("group %s lag %d pending %d", group, g.Lag, g.Pending)
		}
	}
	return rt.sameRows(db)
}

// explainDiff logs, for each row of db that differs from A, the differing columns and the queue's
// events of that key, so a failure says whether the queue or the sink went wrong.
func (rt *roundTrip) explainDiff(db string) {
	a, _ := rowHashes(rt.ctx, rt.pg.Pool())
	b, _ := rowHashes(rt.ctx, rt.pools[db])
	entries, _ := oracle.ReadQueue(rt.ctx, rt.rd.Client(), "pgrelay", "q")
	shown := 0
	for id := range a {
		if a[id] == b[id] || shown == 3 {
			continue
		}
		shown++
		colsA, colsB := rowColumns(rt.ctx, rt.pg.Pool(), id), rowColumns(rt.ctx, rt.pools[db], id)
		for c, v := range colsA {
			if colsB[c] != v {
				rt.t.Logf("id %d column %s: A %s, %s %s", id, c, clip(v), db, clip(colsB[c]))
			}
		}
		for _, e := range entries {
			if strings.Contains(string(e.Payload), fmt.Sprintf(`"key":{"id":%d}`, id)) || strings.Contains(string(e.Payload), fmt.Sprintf(`"before":{"id":%d}`, id)) {
				rt.t.Logf("  queue shard %d off %d id %s: %s", e.Shard, e.Off, e.ID, clip(string(e.Payload)))
			}
		}
	}
}

// rowColumns reads one row of rt as column → text (NULL as <null>).
func rowColumns(ctx context.Context, pool *pgxpool.Pool, id int64) map[string]string {
	out := map[string]string{}
	rows, err := pool.Query(ctx, `SELECT key, coalesce(value, '<null>') FROM rt t, jsonb_each_text(to_jsonb(t)) WHERE id = $1`, id)
	if err != nil {
		return out
	}
	defer rows.Close()
	for rows.Next() {
		var k, v string
		if rows.Scan(&k, &v) == nil {
			out[k] = v
		}
	}
	return out
}

func clip(s string) string {
	if len(s) > 300 {
		return fmt.Sprintf("%s...(%d bytes)...%s", s[:150], len(s), s[len(s)-100:])
	}
	return s
}

// writers runs two concurrent writers on A for d, each committing random transactions (inserts,
// updates with and without the TOASTed column, deletes, key changes); a transaction that fails (two
// writers on one row) is rolled back. wait returns the number of committed transactions.
func (rt *roundTrip) writers(seed uint64, d time.Duration) (wait func() int) {
	stop := make(chan struct{})
	time.AfterFunc(d, func() { close(stop) })
	return cdctest.Writers(seed, 2, 8, stop, rt.randomRTTx)
}

// rtValues are random values for the non-key columns.
func rtValues(rng *rand.Rand) (doc, amount string, big int64, tags []*string) {
	doc = fmt.Sprintf(`{"big": %d, "nested": {"a": [1, "x,y", null, {"q": "say \"hi\" {}"}]}, "s": "é\\\\%d"}`,
		uint64(1)<<60+uint64(rng.IntN(1e6)), rng.IntN(100))
	sign := ""
	if rng.IntN(3) == 0 {
		sign = "-"
	}
	amount = fmt.Sprintf("%s%d%029d.%d", sign, 1+rng.IntN(9), rng.Int64N(1e18), rng.IntN(1e6)) // 30 digits before the point
	big = int64(1)<<53 + rng.Int64N(int64(1)<<61)
	pool := []string{"plain", "a,b", `say "hi"`, "{brace}", `back\slash`, "", "NULL", " spaced ", "é"}
	for i, n := 0, rng.IntN(5); i < n; i++ {
		if rng.IntN(5) == 0 {
			tags = append(tags, nil)
			continue
		}
		s := pool[rng.IntN(len(pool))]
		tags = append(tags, &s)
	}
	return doc, amount, big, tags
}

// rtBody is a 20–40 kB text.
func rtBody(rng *rand.Rand) string {
	const letters = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 \"',{}\\é"
	chunk := make([]rune, 512)
	runes := []rune(letters)
	for i := range chunk {
		chunk[i] = runes[rng.IntN(len(runes))]
	}
	return strings.Repeat(string(chunk), 40+rng.IntN(40))
}

func (rt *roundTrip) randomRTTx(rng *rand.Rand) bool {
	ctx := rt.ctx
	tx, err := rt.pg.Pool().Begin(ctx)
	if err != nil {
		return false
	}
	defer tx.Rollback(ctx)
	for i, n := 0, 1+rng.IntN(3); i < n; i++ {
		id := 1 + rng.Int64N(120)
		doc, amount, big, tags := rtValues(rng)
		switch op := rng.IntN(20); {
		case op < 6: // insert, or replace the whole row
			_, err = tx.Exec(ctx, `INSERT INTO rt (id, doc, amount, big, tags, body) VALUES ($1, $2::jsonb, $3::numeric, $4, $5, $6)
				ON CONFLICT (id) DO UPDATE SET doc = excluded.doc, amount = excluded.amount, big = excluded.big, tags = excluded.tags, body = excluded.body, n = rt.n + 1`,
				id, doc, amount, big, tags, rtBody(rng))
		case op < 12: // update leaving the TOASTed body unchanged
			_, err = tx.Exec(ctx, `UPDATE rt SET doc = $2::jsonb, amount = $3::numeric, big = $4, tags = $5, n = n + 1, ts = now() WHERE id = $1`,
				id, doc, amount, big, tags)
		case op < 14: // a new body
			_, err = tx.Exec(ctx, `UPDATE rt SET body = $2, n = n + 1 WHERE id = $1`, id, rtBody(rng))
		case op < 16:
			_, err = tx.Exec(ctx, `DELETE FROM rt WHERE id = $1`, id)
		case op < 19: // key change, body unchanged
			_, err = tx.Exec(ctx, `UPDATE rt SET id = $2 WHERE id = $1`, id, 1+rng.Int64N(240))
		default: // key change together with other columns
			_, err = tx.Exec(ctx, `UPDATE rt SET id = $2, amount = $3::numeric, tags = $4 WHERE id = $1`, id, 1+rng.Int64N(240), amount, tags)
		}
		if err != nil {
			return false
		}
	}
	return tx.Commit(ctx) == nil
}

// TestRoundTripAToQueueToB: two writers change table rt of database A (jsonb, 30-digit numerics,
// bigints past 2^53, arrays with NULL/commas/quotes/braces, 20–40 kB TOASTed NOT NULL values, updates that
// leave them unchanged, deletes, key changes) while one pgrelay streams A into queue q (pg_cdc →
// redis_queue) and another copies q into database B (redis_queue → pg_sink cdc); the sink process is
// SIGKILLed once mid-run. When the writers stop: md5 of every row of B equals A, and still does
// after a new sink process has waited out the dead one's shard leases.
func TestRoundTripAToQueueToB(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end test")
	}
	rt := newRoundTrip(t, "roundtrip")
	dsnB := rt.database("b")
	// body NOT NULL (without a default), so the copy's upserts of updates that leave it unchanged
	// must keep the stored value rather than fail NOT NULL
	rt.pg.Exec(`ALTER TABLE rt ALTER COLUMN body SET NOT NULL`)
	if _, err := rt.pools["b"].Exec(rt.ctx, `ALTER TABLE rt ALTER COLUMN body SET NOT NULL`); err != nil {
		t.Fatal(err)
	}
	cfg := rt.sinkConfig(dsnB, "copy_b", "copy_b")
	p := startSinkPipeline(t, cfg)

	start := time.Now()
	wait := rt.writers(42, 8*time.Second)
	// SIGKILL the sink once while the writers run, after it has applied something
	cdctest.WaitEvery(t, 60*time.Second, 250*time.Millisecond, "the sink applying", func() (bool, string) {
		return len(rt.progress("b", "copy_b")) > 0, sinkLastLines(p.Output(), 5)
	})
	time.Sleep(time.Second)
	p.Kill()
	t.Logf("sink SIGKILLed %s after the writers started", time.Since(start).Round(time.Millisecond))
	time.Sleep(time.Second)
	p = startSinkPipeline(t, cfg)
	committed := wait()
	t.Logf("writers committed %d transactions in %s", committed, time.Since(start).Round(time.Millisecond))
	if committed < 100 {
		t.Fatalf("only %d transactions committed", committed)
	}
	var rows, toasted int
	if err := rt.pg.Pool().QueryRow(rt.ctx, `SELECT count(*), count(*) FILTER (WHERE length(body) >= 20000) FROM rt`).Scan(&rows, &toasted); err != nil {
		t.Fatal(err)
	}
	if toasted == 0 {
		t.Fatalf("no TOASTed rows among %d", rows)
	}
	rt.assertQueueHas(`"unchanged":["body"]`, `"op":"d"`, `.1 {"op":"c"`)

	rt.waitCaughtUp("b", "copy_b", p, 90*time.Second)
	t.Logf("B equals A (%d rows, %d with 20–40 kB bodies) %s after the writers started", rows, toasted, time.Since(start).Round(time.Millisecond))

	// the leases of a dead sink expire and a new process takes the shards over: still equal
	p.Kill()
	p = startSinkPipeline(t, cfg)
	time.Sleep(3*time.Second + 3*time.Second) // > lease_ttl, then a tick to take the shards
	rt.waitCaughtUp("b", "copy_b", p, 30*time.Second)
	if ok, state := rt.sameRows("b"); !ok {
		t.Fatalf("after the leases expired: %s", state)
	}
	rt.assertProgressAtQueueEnd("b", "copy_b")
}

// assertQueueHas replays the queue with the oracle (it must equal A: the writers have stopped) and
// checks that it holds events of every kind the test means to exercise.
func (rt *roundTrip) assertQueueHas(fragments ...string) {
	rt.t.Helper()
	rt.converge("public.rt", "id")
	entries, err := oracle.ReadQueue(rt.ctx, rt.rd.Client(), "pgrelay", "q")
	if err != nil {
		rt.t.Fatal(err)
	}
	var counts []string
	for _, f := range fragments {
		n := 0
		for _, e := range entries {
			if strings.Contains(e.ID+" "+string(e.Payload), f) {
				n++
			}
		}
		if n == 0 {
			rt.t.Errorf("no queue entry contains %s", f)
		}
		counts = append(counts, fmt.Sprintf("%d × %s", n, f))
	}
	rt.t.Logf("queue: %d entries; %s", len(entries), strings.Join(counts, ", "))
}

// progress reads the progress rows of sinkName in database db: shard → last_offset.
func (rt *roundTrip) progress(db, sinkName string) map[int]int64 {
	rows, err := rt.pools[db].Query(rt.ctx, `SELECT shard, last_offset FROM pgrelay.sink_progress WHERE sink = $1 AND queue = 'q'`, sinkName)
	if err != nil {
		return nil // not created yet
	}
	defer rows.Close()
	got := map[int]int64{}
	for rows.Next() {
		var s int
		var o int64
		if err := rows.Scan(&s, &o); err != nil {
			rt.t.Fatal(err)
		}
		got[s] = o
	}
	return got
}

// assertProgressAtQueueEnd checks that each shard's progress row of sinkName (in database db) stands
// at the shard's last offset, and that no message was dead-lettered.
func (rt *roundTrip) assertProgressAtQueueEnd(db, sinkName string) {
	rt.t.Helper()
	info, err := queue.Inspect(rt.ctx, rt.rd.Client(), queue.NewLayout("pgrelay"), "q")
	if err != nil {
		rt.t.Fatal(err)
	}
	got := rt.progress(db, sinkName)
	for _, s := range info.ShardInfo {
		if got[s.Shard] != s.LastOffset {
			rt.t.Errorf("sink %s shard %d: progress %d, last offset %d", sinkName, s.Shard, got[s.Shard], s.LastOffset)
		}
	}
	if info.DeadLetters != 0 {
		rt.t.Errorf("%d dead letters", info.DeadLetters)
	}
}

// waitSourceDone waits until the source's pointer covers every transaction committed so far.
func (rt *roundTrip) waitSourceDone() {
	rt.t.Helper()
	var now pglogrepl.LSN
	if err := rt.pg.Pool().QueryRow(rt.ctx, `SELECT pg_current_wal_lsn()::text`).Scan(&now); err != nil {
		rt.t.Fatal(err)
	}
	cdctest.WaitEvery(rt.t, 60*time.Second, 250*time.Millisecond, "the source's pointer past "+now.String(), func() (bool, string) {
		p := rt.pointer()
		return p != nil && p.LSNValue()+1 >= now, fmt.Sprint(p)
	})
}

// waitApplied waits until sinkName (in db, reading with group) has applied the whole queue: the
// group has nothing left to read or ack and every shard's progress row stands at its last offset.
func (rt *roundTrip) waitApplied(db, sinkName string, p *testenv.Process) {
	rt.t.Helper()
	cdctest.WaitEvery(rt.t, 90*time.Second, 250*time.Millisecond, sinkName+" at the end of the queue", func() (bool, string) {
		info, err := queue.Inspect(rt.ctx, rt.rd.Client(), queue.NewLayout("pgrelay"), "q")
		if err != nil {
			return false, err.Error()
		}
		got := rt.progress(db, sinkName)
		for _, s := range info.ShardInfo {
			if got[s.Shard] != s.LastOffset {
				return false, fmt.Sprintf("shard %d at %d of %d; output: %s", s.Shard, got[s.Shard], s.LastOffset, sinkLastLines(p.Output(), 5))
			}
		}
		return true, ""
	})
}

// TestSinkWaitsForAColumnAddedAtTheSource: a column added to the source table while it streams
// reaches the copy's sink before the copy has it. With unknown_keys: pause the sink stops there
// (target_column_missing in its log, the rows written since not applied, the process up) and, once
// the column is added to the copy, writes every row with it: the copy equals the source row for
// row. With the default (warn) another copy goes on without the column and logs the key once.
func TestSinkWaitsForAColumnAddedAtTheSource(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end test")
	}
	rt := newRoundTrip(t, "addcol")
	dsnB, dsnC := rt.database("b"), rt.database("c")
	pipeline := func(dsn, name, unknownKeys string) *testenv.Process {
		return startSinkPipeline(t, sinkPipeline{redisURL: rt.rd.URL(), queue: "q", group: name, dsn: dsn, sink: name,
			table: "public.rt", mode: "cdc", batchCount: 64, maxAttempts: 3, unknownKeys: unknownKeys}.YAML())
	}
	strict, lenient := pipeline(dsnB, "copy_b", "pause"), pipeline(dsnC, "copy_c", "")
	insert := func(from, to int, note bool) {
		t.Helper()
		sql := `INSERT INTO rt (id, amount) SELECT g, g * 1.5 FROM generate_series($1::int, $2::int) g`
		if note {
			sql = `INSERT INTO rt (id, amount, note) SELECT g, g * 1.5, 'note ' || g FROM generate_series($1::int, $2::int) g`
		}
		if _, err := rt.pg.Pool().Exec(rt.ctx, sql, from, to); err != nil {
			t.Fatal(err)
		}
	}
	insert(1, 100, false)
	rt.waitCaughtUp("b", "copy_b", strict, 60*time.Second)

	rt.pg.Exec(`ALTER TABLE rt ADD COLUMN note text`)
	insert(101, 200, true)
	rt.pg.Exec(`UPDATE rt SET note = 'set later ' || id WHERE id <= 10`)
	cdctest.WaitEvery(t, 60*time.Second, 250*time.Millisecond, "copy_b pausing on the new column", func() (bool, string) {
		out := strict.Output()
		return strings.Contains(out, "target_column_missing") && strings.Contains(out, `payload key \"note\" has no column in public.rt`), sinkLastLines(out, 3)
	})
	var n int
	if err := rt.pools["b"].QueryRow(rt.ctx, `SELECT count(*) FROM rt`).Scan(&n); err != nil || n != 100 {
		t.Fatalf("the paused copy has %d rows (%v), want the 100 written before the column", n, err)
	}
	if strict.Exited() {
		t.Fatalf("the paused sink exited: %s", sinkLastLines(strict.Output(), 5))
	}

	if _, err := rt.pools["b"].Exec(rt.ctx, `ALTER TABLE rt ADD COLUMN note text`); err != nil {
		t.Fatal(err)
	}
	rt.waitCaughtUp("b", "copy_b", strict, 60*time.Second)
	var notes int
	if err := rt.pools["b"].QueryRow(rt.ctx, `SELECT count(note) FROM rt`).Scan(&notes); err != nil || notes != 110 {
		t.Fatalf("the copy has %d notes (%v), want 110", notes, err)
	}

	cdctest.WaitEvery(t, 60*time.Second, 250*time.Millisecond, "copy_c writing the rows without the column", func() (bool, string) {
		var n int
		err := rt.pools["c"].QueryRow(rt.ctx, `SELECT count(*) FROM rt`).Scan(&n)
		return err == nil && n == 200, fmt.Sprintf("%d rows %v", n, err)
	})
	if got := strings.Count(lenient.Output(), `payload key \"note\" names no column of public.rt`); got != 1 {
		t.Fatalf("the default sink logged the unknown key %d times, want once: %s", got, sinkLastLines(lenient.Output(), 5))
	}
}
