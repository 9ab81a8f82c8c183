package tests

import (
	"context"
	"fmt"
	"math/big"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/redpanda-data/benthos/v4/public/service"

	"github.com/pgrelay/pgrelay/internal/cdctest"
	"github.com/pgrelay/pgrelay/internal/queue"
	"github.com/pgrelay/pgrelay/internal/testenv"
)

// queueMessages writes msgs into queue q (shards shards) through the redis_queue output, per
// messages a batch, with each message's partition and id.
func queueMessages(t *testing.T, redisURL, q string, shards int, msgs []sinkMessage, per int) {
	t.Helper()
	b := service.NewStreamBuilder()
	if err := b.SetLoggerYAML("level: warn"); err != nil {
		t.Fatal(err)
	}
	send, err := b.AddBatchProducerFunc()
	if err != nil {
		t.Fatal(err)
	}
	if err := b.AddOutputYAML(fmt.Sprintf(`
redis_queue:
  url: %s
  queue: %s
  partition: ${! meta("p") }
  id: ${! meta("id") }
  shards: %d
  max_in_flight: 1
`, redisURL, q, shards)); err != nil {
		t.Fatal(err)
	}
	stop := cdctest.RunStream(t, b)
	defer func() { _ = stop() }()
	for i := 0; i < len(msgs); i += per {
		var batch service.MessageBatch
		for _, m := range msgs[i:min(i+per, len(msgs))] {
			bm := service.NewMessage([]byte(m.payload))
			bm.MetaSetMut("p", m.partition)
			bm.MetaSetMut("id", m.id)
			batch = append(batch, bm)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		err := send(ctx, batch)
		cancel()
		if err != nil {
			t.Fatalf("produce: %v", err)
		}
	}
}

// sinkMessage is one payload for a partition.
type sinkMessage struct{ partition, id, payload string }

// sinkPipeline is a redis_queue → pg_sink pipeline for the pgrelay binary: the group reads the
// queue batchCount messages a batch, dead-lettering a message after maxAttempts, and the sink
// applies it to table in mode, four batches in flight.
type sinkPipeline struct {
	redisURL, queue, group  string
	dsn, sink, table, mode  string
	batchCount, maxAttempts int
	unknownKeys             string // pg_sink's unknown_keys; empty: the default
	tables                  string // pg_sink's tables (a YAML flow map), instead of table
}

func (c sinkPipeline) YAML() string {
	return fmt.Sprintf(`
http: { enabled: false }
logger: { level: warn }
input:
  redis_queue:
    url: %s
    queue: %s
    group: %s
    start_from: earliest
    batch_count: %d
    max_attempts: %d
    lease_ttl: 3s
output:
  pg_sink:
    dsn: %q
    name: %s
    %s
    mode: %s
    max_in_flight: 4
`, c.redisURL, c.queue, c.group, c.batchCount, c.maxAttempts, c.dsn, c.sink, c.targetLine(), c.mode) + c.unknownKeysLine()
}

func (c sinkPipeline) targetLine() string {
	if c.tables != "" {
		return "tables: " + c.tables
	}
	return "table: " + c.table
}

func (c sinkPipeline) unknownKeysLine() string {
	if c.unknownKeys == "" {
		return ""
	}
	return "    unknown_keys: " + c.unknownKeys + "\n"
}

// itemsCopy copies queue items into table items (sink and group items_copy).
func itemsCopy(redisURL, dsn, mode string, batchCount, maxAttempts int) string {
	return sinkPipeline{redisURL: redisURL, queue: "items", group: "items_copy", dsn: dsn, sink: "items_copy", table: "items",
		mode: mode, batchCount: batchCount, maxAttempts: maxAttempts}.YAML()
}

// startSinkPipeline runs the pgrelay binary with a redis_queue → pg_sink config.
func startSinkPipeline(t *testing.T, config string) *testenv.Process {
	t.Helper()
	return testenv.StartProcess(t, nil, testenv.Binary(t), "-c", writeConfig(t, "sink.yaml", config))
}

// sinkOffsets reads a sink's progress rows: shard → last_offset.
func sinkOffsets(t *testing.T, pg *testenv.Postgres, sinkName, q string) map[int]int64 {
	t.Helper()
	rows, err := pg.Pool().Query(context.Background(), `SELECT shard, last_offset FROM pgrelay.sink_progress WHERE sink = $1 AND queue = $2`, sinkName, q)
	if err != nil {
		return nil
	}
	defer rows.Close()
	out := map[int]int64{}
	for rows.Next() {
		var s int
		var o int64
		if err := rows.Scan(&s, &o); err != nil {
			t.Fatal(err)
		}
		out[s] = o
	}
	return out
}

// TestSinkAccountsExactlyOnceUnderSIGKILL: a non-idempotent UPDATE in sql mode, 20,000 messages over
// 200 partitions (some amounts with 30 digits), pgrelay SIGKILLed 5 times while it applies them:
// every balance equals its exact sum and each shard's progress row stands at the shard's last offset.
func TestSinkAccountsExactlyOnceUnderSIGKILL(t *testing.T) {
	if testing.Short() {
		t.Skip("fault test")
	}
	pg := testenv.StartPostgres(t)
	r := testenv.StartRedis(t)
	const accounts, total, shards = 200, 20000, 16
	pg.Exec(`CREATE TABLE accounts (id bigint PRIMARY KEY, balance numeric NOT NULL DEFAULT 0)`)
	pg.Exec(`INSERT INTO accounts (id) SELECT generate_series(1, $1::int)`, accounts)

	rng := rand.New(rand.NewPCG(7, 11))
	want := make([]*big.Rat, accounts+1)
	for i := range want {
		want[i] = new(big.Rat)
	}
	msgs := make([]sinkMessage, total)
	for i := range msgs {
		acct := rng.IntN(accounts) + 1
		var amount string
		if i%40 == 0 {
			amount = fmt.Sprintf("%d%029d", 1+rng.IntN(9), rng.Int64()) // 30 digits
		} else {
			amount = fmt.Sprintf("%d.%02d", rng.IntN(20001)-10000, rng.IntN(100))
		}
		v, ok := new(big.Rat).SetString(amount)
		if !ok {
			t.Fatalf("bad amount %s", amount)
		}
		want[acct].Add(want[acct], v)
		msgs[i] = sinkMessage{partition: fmt.Sprint(acct), id: fmt.Sprintf("acct-%d", i),
			payload: fmt.Sprintf(`{"id":%d,"amount":%s}`, acct, amount)}
	}
	config := fmt.Sprintf(`
http: { enabled: false }
logger: { level: warn }
input:
  redis_queue:
    url: %s
    queue: accounts
    group: balances
    batch_count: 100
    lease_ttl: 3s
output:
  pg_sink:
    dsn: %q
    name: balances
    mode: sql
    statement: UPDATE accounts SET balance = balance + $1::numeric WHERE id = $2::bigint
    params: [ $.amount, $.id ]
    max_in_flight: 4
`, r.URL(), pg.DSN())
	killWhileApplying(t, pg, r, msgs, shards, config, "balances", "accounts")

	rows, err := pg.Pool().Query(context.Background(), `SELECT id, balance::text FROM accounts ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for rows.Next() {
		var id int
		var bal string
		if err := rows.Scan(&id, &bal); err != nil {
			t.Fatal(err)
		}
		got, _ := new(big.Rat).SetString(bal)
		if got.Cmp(want[id]) != 0 {
			t.Errorf("account %d: balance %s, want %s", id, bal, want[id].FloatString(2))
		}
		n++
	}
	rows.Close()
	if n != accounts {
		t.Fatalf("%d accounts", n)
	}
}

// TestSinkAppendExactlyOnceUnderSIGKILL: append mode (streamed COPY, binary values) writes 10,000
// messages over 16 shards while pgrelay is SIGKILLed 5 times; a few messages leave out a column,
// so their batches take the grouped COPY instead. Every message is one row, none twice.
func TestSinkAppendExactlyOnceUnderSIGKILL(t *testing.T) {
	if testing.Short() {
		t.Skip("fault test")
	}
	pg := testenv.StartPostgres(t)
	r := testenv.StartRedis(t)
	const total, shards = 10000, 16
	pg.Exec(`CREATE TABLE ledger (msg text NOT NULL, acct bigint, cents bigint, ratio float8, flag bool, attrs jsonb)`)
	msgs := make([]sinkMessage, total)
	var sum int64
	for i := range msgs {
		cents := int64(i*7919%100000 - 50000)
		sum += cents
		attrs := fmt.Sprintf(`,"attrs":{"i":%d,"tag":"t\t%d"}`, i, i%13)
		if i%2000 == 1 {
			attrs = ""
		}
		msgs[i] = sinkMessage{partition: fmt.Sprint(i % 200), id: fmt.Sprintf("m-%d", i),
			payload: fmt.Sprintf(`{"msg":"m-%d","acct":%d,"cents":%d,"ratio":%v,"flag":%v%s}`, i, i%200, cents, float64(i)/7, i%2 == 0, attrs)}
	}
	config := fmt.Sprintf(`
http: { enabled: false }
logger: { level: warn }
input:
  redis_queue:
    url: %s
    queue: ledger
    group: ledger
    batch_count: 100
    lease_ttl: 3s
output:
  pg_sink:
    dsn: %q
    name: ledger
    table: ledger
    mode: append
    max_in_flight: 4
`, r.URL(), pg.DSN())
	killWhileApplying(t, pg, r, msgs, shards, config, "ledger", "ledger")

	var rows, distinct, withAttrs int64
	var gotSum string
	if err := pg.Pool().QueryRow(context.Background(), `SELECT count(*), count(DISTINCT msg), count(attrs), sum(cents)::text FROM ledger`).
		Scan(&rows, &distinct, &withAttrs, &gotSum); err != nil {
		t.Fatal(err)
	}
	if rows != total || distinct != total || withAttrs != total-total/2000 || gotSum != fmt.Sprint(sum) {
		t.Fatalf("%d rows, %d messages, %d with attrs, sum %s; want %d rows of %d messages, %d with attrs, sum %d",
			rows, distinct, withAttrs, gotSum, total, total, total-total/2000, sum)
	}
}

// TestSinkUpsertExactlyOnceUnderSIGKILL: upsert mode with batches large enough to go in pieces
// (one pipeline: the first piece, the rest, the progress update and COMMIT), 30,000 messages on
// 3,000 keys over 16 shards while pgrelay is SIGKILLed 5 times. A row trigger records every write
// the sink makes: each message's value is written exactly once (none lost, none twice), and each
// key holds its partition's last message.
func TestSinkUpsertExactlyOnceUnderSIGKILL(t *testing.T) {
	if testing.Short() {
		t.Skip("fault test")
	}
	pg := testenv.StartPostgres(t)
	r := testenv.StartRedis(t)
	const total, keys, shards = 30000, 3000, 16
	pg.Exec(`CREATE TABLE kv (id bigint PRIMARY KEY, v bigint NOT NULL, note text)`)
	pg.Exec(`CREATE TABLE kv_writes (v bigint NOT NULL)`)
	pg.Exec(`CREATE FUNCTION kv_write() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN INSERT INTO kv_writes VALUES (NEW.v); RETURN NULL; END $$`)
	pg.Exec(`CREATE TRIGGER kv_write AFTER INSERT OR UPDATE ON kv FOR EACH ROW EXECUTE FUNCTION kv_write()`)
	rng := rand.New(rand.NewPCG(5, 9))
	last := map[int]int{} // key → its last message
	msgs := make([]sinkMessage, total)
	for i := range msgs {
		k := rng.IntN(keys)
		last[k] = i
		msgs[i] = sinkMessage{partition: fmt.Sprint(k), id: fmt.Sprintf("kv-%d", i),
			payload: fmt.Sprintf(`{"id":%d,"v":%d,"note":"n%d"}`, k, i, i)}
	}
	config := sinkPipeline{redisURL: r.URL(), queue: "kv", group: "kv", dsn: pg.DSN(), sink: "kv", table: "kv",
		mode: "upsert", batchCount: 300, maxAttempts: 5}.YAML()
	killWhileApplying(t, pg, r, msgs, shards, config, "kv", "kv")

	var writes, distinct int64
	var lo, hi int64
	if err := pg.Pool().QueryRow(context.Background(), `SELECT count(*), count(DISTINCT v), min(v), max(v) FROM kv_writes`).
		Scan(&writes, &distinct, &lo, &hi); err != nil {
		t.Fatal(err)
	}
	if writes != total || distinct != total || lo != 0 || hi != total-1 {
		t.Fatalf("%d writes of %d values (%d-%d); want each of the %d messages written once", writes, distinct, lo, hi, total)
	}
	rows, err := pg.Pool().Query(context.Background(), `SELECT id, v FROM kv`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	n := 0
	for rows.Next() {
		var k, v int
		if err := rows.Scan(&k, &v); err != nil {
			t.Fatal(err)
		}
		if want, ok := last[k]; !ok || v != want {
			t.Errorf("key %d holds message %d, want %d", k, v, want)
		}
		n++
	}
	if n != len(last) {
		t.Fatalf("%d keys, want %d", n, len(last))
	}
}

// killWhileApplying writes msgs into queue q (shards shards), runs the pgrelay binary with config
// 5 times, SIGKILLing it each time while it applies (after it has moved the sink's offsets on by a
// share of what is left), then once more to the end: every shard applied to its last offset, one
// progress row per non-empty shard, no dead letters.
func killWhileApplying(t *testing.T, pg *testenv.Postgres, r *testenv.Redis, msgs []sinkMessage, shards int, config, sink, q string) {
	t.Helper()
	queueMessages(t, r.URL(), q, shards, msgs, 500)
	total := int64(len(msgs))
	applied := func() int64 {
		var n int64
		for _, o := range sinkOffsets(t, pg, sink, q) {
			n += o
		}
		return n
	}
	for kill := 1; kill <= 5; kill++ {
		p := startSinkPipeline(t, config)
		// each kill lands while this process is applying: after it has moved the offsets on by a
		// share of what is left, never at the end
		start := applied()
		target := start + (total-start)/int64(7-kill)
		cdctest.WaitEvery(t, 90*time.Second, 20*time.Millisecond, fmt.Sprintf("progress past %d before kill %d", target, kill), func() (bool, string) {
			return applied() >= target, "output: " + sinkLastLines(p.Output(), 5)
		})
		p.Kill()
		t.Logf("kill %d: SIGKILL with %d of %d messages applied (this run started at %d)", kill, applied(), total, start)
	}
	p := startSinkPipeline(t, config)
	info := func() *queue.Info {
		i, err := queue.Inspect(context.Background(), r.Client(), queue.NewLayout("pgrelay"), q)
		if err != nil {
			t.Fatal(err)
		}
		return i
	}
	qi := info()
	cdctest.WaitEvery(t, 120*time.Second, 250*time.Millisecond, "every shard applied to its last offset", func() (bool, string) {
		got := sinkOffsets(t, pg, sink, q)
		for _, s := range qi.ShardInfo {
			if s.LastOffset > 0 && got[s.Shard] != s.LastOffset {
				return false, fmt.Sprintf("shard %d at %d of %d; output: %s", s.Shard, got[s.Shard], s.LastOffset, sinkLastLines(p.Output(), 5))
			}
		}
		return true, ""
	})
	p.Kill()

	got := sinkOffsets(t, pg, sink, q)
	nonEmpty := 0
	for _, s := range qi.ShardInfo {
		if s.LastOffset > 0 {
			nonEmpty++
			if got[s.Shard] != s.LastOffset {
				t.Errorf("shard %d: progress %d, last offset %d", s.Shard, got[s.Shard], s.LastOffset)
			}
		}
	}
	var progressRows int
	if err := pg.Pool().QueryRow(context.Background(), `SELECT count(*) FROM pgrelay.sink_progress WHERE sink = $1`, sink).Scan(&progressRows); err != nil {
		t.Fatal(err)
	}
	if progressRows != nonEmpty {
		t.Errorf("%d progress rows for %d non-empty shards", progressRows, nonEmpty)
	}
	if dl := info().DeadLetters; dl != 0 {
		t.Errorf("%d dead letters", dl)
	}
}

// TestSinkPoisonMessages: a CHECK constraint violated by 3 messages (first of one partition, middle
// of another, last of a third) among 950 good ones: the table holds the last good write per id, the
// dead-letter stream holds exactly those 3 with the 23514 error, everything else is applied.
func TestSinkPoisonMessages(t *testing.T) {
	pg := testenv.StartPostgres(t)
	r := testenv.StartRedis(t)
	pg.Exec(`CREATE TABLE items (id int PRIMARY KEY, v int NOT NULL CHECK (v >= 0), seq int NOT NULL)`)
	const ids, good = 30, 950
	perID := map[int][]sinkMessage{}
	seq := 0
	for i := 0; i < good; i++ {
		id := i%ids + 1
		seq++
		perID[id] = append(perID[id], sinkMessage{partition: fmt.Sprint(id), id: fmt.Sprintf("good-%d", seq),
			payload: fmt.Sprintf(`{"id":%d,"v":%d,"seq":%d}`, id, seq, seq)})
	}
	wantSeq := map[int]int{}
	for id, ms := range perID {
		var last int
		fmt.Sscanf(ms[len(ms)-1].id, "good-%d", &last)
		wantSeq[id] = last
	}
	poison := func(id int, name string) sinkMessage {
		return sinkMessage{partition: fmt.Sprint(id), id: name, payload: fmt.Sprintf(`{"id":%d,"v":-1,"seq":0}`, id)}
	}
	perID[1] = insertAt(perID[1], poison(1, "poison-first"), "first")
	perID[2] = insertAt(perID[2], poison(2, "poison-middle"), "middle")
	perID[3] = insertAt(perID[3], poison(3, "poison-last"), "last")
	lists := make([][]sinkMessage, ids)
	for id := 1; id <= ids; id++ {
		lists[id-1] = perID[id]
	}
	queueMessages(t, r.URL(), "items", 4, interleave(lists), 100)
	p := startSinkPipeline(t, itemsCopy(r.URL(), pg.DSN(), "upsert", 64, 3))
	waitDrained(t, r, "items", 3, p)
	p.Kill()
	layout := queue.NewLayout("pgrelay")

	dls, err := queue.ListDeadLetters(context.Background(), r.Client(), layout, "items", "", 0)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, d := range dls {
		names = append(names, d.MessageID)
		if !strings.HasPrefix(d.Error, `23514: new row for relation "items" violates check constraint "items_v_check"`) ||
			!strings.Contains(d.Error, "(Failing row contains") {
			t.Errorf("dead letter %s: error %q", d.MessageID, d.Error)
		}
	}
	if got := strings.Join(sinkSorted(names), ","); got != "poison-first,poison-last,poison-middle" {
		t.Fatalf("dead letters %s", got)
	}
	rows, err := pg.Pool().Query(context.Background(), `SELECT id, v, seq FROM items`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	seen := 0
	for rows.Next() {
		var id, v, s int
		if err := rows.Scan(&id, &v, &s); err != nil {
			t.Fatal(err)
		}
		if s != wantSeq[id] || v != s {
			t.Errorf("item %d: v=%d seq=%d, want seq %d", id, v, s, wantSeq[id])
		}
		seen++
	}
	if seen != ids {
		t.Fatalf("%d items, want %d", seen, ids)
	}
}

// insertAt puts m first, in the middle or last of list.
func insertAt(list []sinkMessage, m sinkMessage, pos string) []sinkMessage {
	switch pos {
	case "first":
		return append([]sinkMessage{m}, list...)
	case "middle":
		mid := len(list) / 2
		return append(append(append([]sinkMessage{}, list[:mid]...), m), list[mid:]...)
	}
	return append(list, m)
}

// interleave takes one message of each list in turn, keeping each list's (partition's) order.
func interleave(lists [][]sinkMessage) []sinkMessage {
	var all []sinkMessage
	for round := 0; ; round++ {
		added := false
		for _, l := range lists {
			if round < len(l) {
				all = append(all, l[round])
				added = true
			}
		}
		if !added {
			return all
		}
	}
}

// waitDrained waits until queue q's (only) group has no lag and nothing pending and the queue
// holds deadLetters dead letters.
func waitDrained(t *testing.T, r *testenv.Redis, q string, deadLetters int, p *testenv.Process) {
	t.Helper()
	cdctest.WaitEvery(t, 120*time.Second, 250*time.Millisecond, fmt.Sprintf("the queue drained with %d dead letters", deadLetters), func() (bool, string) {
		i, err := queue.Inspect(context.Background(), r.Client(), queue.NewLayout("pgrelay"), q)
		if err != nil || len(i.Groups) == 0 {
			return false, fmt.Sprint(err)
		}
		g := i.Groups[0]
		return g.Lag == 0 && g.Pending == 0 && i.DeadLetters == int64(deadLetters),
			fmt.Sprintf("lag %d pending %d dead %d; output: %s", g.Lag, g.Pending, i.DeadLetters, sinkLastLines(p.Output(), 5))
	})
}

func sinkSorted(s []string) []string {
	out := append([]string(nil), s...)
	for i := range out {
		for j := i + 1; j < len(out); j++ {
			if out[j] < out[i] {
				out[i], out[j] = out[j], out[i]
			}
		}
	}
	return out
}

func sinkLastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, " | ")
}
