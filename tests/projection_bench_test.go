package tests

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	"gopkg.in/yaml.v3"

	"github.com/pgrelay/pgrelay/internal/benchenv"
	"github.com/pgrelay/pgrelay/internal/benchenv/follow"
	"github.com/pgrelay/pgrelay/internal/cdctest"
	"github.com/pgrelay/pgrelay/internal/errcode"
	"github.com/pgrelay/pgrelay/internal/queue"
	"github.com/pgrelay/pgrelay/internal/sink"
	"github.com/pgrelay/pgrelay/internal/testenv"
)

// BenchmarkProjection measures the read-model recipe (docs/recipes.md) with the shipped configs
// through the binary: pg_cdc → redis_queue (config/order_docs_source.yaml) and redis_queue →
// pg_sink sql (config/order_docs_projection.yaml). The transactions alternate between a new order
// with 3 items (4 changes) and a quantity + status change of an earlier order (2 changes).
//
//   - latency: PGRELAY_BENCH_PROJECTION_TPS transactions/s (200) for PGRELAY_BENCH_SECONDS (5):
//     commit time (the event's ts) → the document committed (a NOTIFY from a trigger on
//     order_docs, added to this benchmark's read model only), p50/p95/p99; beside it, commit →
//     the event readable in the queue (a blocking XREAD) of the same transactions; after a second
//     of the same transactions as a warm-up (the projection's first batches after its start run
//     on new connections and backends and took 12-50 ms, which alone set the p99 of a 5-second
//     window; the reference figures are a running projector's); PGRELAY_BENCH_SLOWEST=n logs
//     the window's n slowest documents;
//   - live: 4 writers as fast as they can for twice that time while the projection follows:
//     changes / (first commit → every change's document committed), beside the writers' own rate;
//   - replay: the whole queue from its start into an empty read model (PGRELAY_BENCH_RUNS runs, 3),
//     beside a hand-written projector over the same entries in the same run: XREADGROUP COUNT 500
//     over the 16 shards, the recipe's two statements per entry in one pipeline, one transaction
//     per read, XACK (no progress rows);
//
// and the CPU time per change of the source and projection processes, redis-server and PostgreSQL.
// The reference projector's published figures are the goals (docs/benchmarks.md).
func BenchmarkProjection(b *testing.B) {
	s := newShop(b, testenv.WithPGSetting("autovacuum = off"))
	source := s.startSource()
	s.waitPointer()
	s.pg.Exec(`INSERT INTO orders (id, customer) VALUES (0, 'warm-up')`) // the queue exists from here on
	cdctest.WaitEvery(b, time.Minute, 10*time.Millisecond, "the first entry", func() (bool, string) { return s.queueEnd() > 0, "" })
	ctx := s.ctx
	pm, err := benchenv.PostmasterPid(s.pg.DataDir)
	if err != nil {
		b.Fatal(err)
	}
	rpid, err := benchenv.RedisPid(ctx, s.rd.Client())
	if err != nil {
		b.Fatal(err)
	}
	seconds := benchenv.Size("PGRELAY_BENCH_SECONDS", 5, 2)
	tps := benchenv.Size("PGRELAY_BENCH_PROJECTION_TPS", 200, 200)
	w := &projWriters{s: s}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		var m benchenv.Metrics
		s.projectionLatency(b, &m, w, fmt.Sprintf("lat%d", i), tps, seconds)
		s.projectionLive(b, &m, w, fmt.Sprintf("live%d", i), 2*seconds, source.Pid(), pm, rpid)
		for r := 0; r < benchenv.Runs(); r++ {
			sinkRate, loopRate := s.replaySink(b, &m, fmt.Sprintf("replay%d_%d", i, r), pm), s.replayLoop(b, &m, fmt.Sprintf("loop%d_%d", i, r), pm)
			m.Add("replay_ratio", sinkRate/loopRate)
		}
		m.Report(b)
	}
}

// logSlowest logs the n slowest documents of the window that started at c0: when each was
// committed (from c0), commit → document and commit → queue. A p99 set by one burst shows as slow
// documents committed close together; a machine that is slower throughout, as documents spread
// over the window.
func logSlowest(b *testing.B, n int, c0 time.Time, docAt, queueAt, commitTS map[string]time.Time) {
	type doc struct{ at, doc, queue time.Duration }
	var docs []doc
	for lsn, at := range docAt {
		if !commitTS[lsn].Before(c0) {
			docs = append(docs, doc{commitTS[lsn].Sub(c0), at.Sub(commitTS[lsn]), queueAt[lsn].Sub(commitTS[lsn])})
		}
	}
	sort.Slice(docs, func(i, j int) bool { return docs[i].doc > docs[j].doc })
	for _, d := range docs[:min(n, len(docs))] {
		b.Logf("slow document: committed at %v, commit → document %v, commit → queue %v",
			d.at.Round(time.Millisecond), d.doc.Round(100*time.Microsecond), d.queue.Round(100*time.Microsecond))
	}
}

// projWriters runs the benchmark's transactions; n numbers them across phases.
type projWriters struct {
	s    *shop
	n    atomic.Int64
	pool *pgxpool.Pool
}

// tx runs transaction n: even n a new order with 3 items, odd n a change of an earlier order.
// It returns the number of row changes committed.
func (w *projWriters) tx(ctx context.Context, n int64) (int, error) {
	tx, err := w.pool.Begin(ctx)
	if err != nil {
		return 0, err
	}
	defer tx.Rollback(ctx)
	changes := 0
	if n%2 == 0 {
		id := n/2 + 1
		if _, err := tx.Exec(ctx, `INSERT INTO orders (id, customer) VALUES ($1, $2)`, id, "customer-"+strconv.FormatInt(id%997, 10)); err != nil {
			return 0, err
		}
		if _, err := tx.Exec(ctx, `INSERT INTO order_items SELECT $1::bigint, g, 'SKU-' || (g * 7 + $1::bigint % 13), g, 2.25 * g FROM generate_series(1, 3) g`, id); err != nil {
			return 0, err
		}
		changes = 4
	} else {
		id := n/4 + 1
		for _, q := range []string{`UPDATE order_items SET qty = qty + 1 WHERE order_id = $1 AND line_no = 1`,
			`UPDATE orders SET status = CASE status WHEN 'new' THEN 'paid' ELSE 'sent' END WHERE id = $1`} {
			tag, err := tx.Exec(ctx, q, id)
			if err != nil {
				return 0, err
			}
			changes += int(tag.RowsAffected())
		}
	}
	return changes, tx.Commit(ctx)
}

func (w *projWriters) open(b *testing.B) {
	if w.pool != nil {
		return
	}
	cfg, err := pgxpool.ParseConfig(w.s.pg.DSN())
	if err != nil {
		b.Fatal(err)
	}
	cfg.MaxConns = 8
	if w.pool, err = pgxpool.NewWithConfig(w.s.ctx, cfg); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(w.pool.Close)
}

// atRate runs transactions at tps for d from 4 connections; it returns the changes committed.
func (w *projWriters) atRate(b *testing.B, tps int, d time.Duration) int {
	w.open(b)
	total := int(d.Seconds() * float64(tps))
	var next, changes atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	for c := 0; c < 4; c++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				k := next.Add(1) - 1
				if k >= int64(total) {
					return
				}
				time.Sleep(time.Until(start.Add(time.Duration(k) * time.Second / time.Duration(tps))))
				n, err := w.tx(w.s.ctx, w.n.Add(1)-1)
				if err != nil {
					b.Error(err)
					return
				}
				changes.Add(int64(n))
			}
		}()
	}
	wg.Wait()
	return int(changes.Load())
}

// flatOut runs transactions from 4 connections as fast as they go for d.
func (w *projWriters) flatOut(b *testing.B, d time.Duration) (changes int, took time.Duration) {
	w.open(b)
	var total atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	end := start.Add(d)
	for c := 0; c < 4; c++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(end) {
				n, err := w.tx(w.s.ctx, w.n.Add(1)-1)
				if err != nil {
					b.Error(err)
					return
				}
				total.Add(int64(n))
			}
		}()
	}
	wg.Wait()
	return int(total.Load()), time.Since(start)
}

// queueEnd is the sum of the queue's shard offsets: the number of entries ever written.
func (s *shop) queueEnd() int64 {
	s.t.Helper()
	info, err := queue.Inspect(s.ctx, s.rd.Client(), queue.NewLayout("pgrelay"), s.queue)
	if errcode.Is(err, errcode.NoQueue) {
		return 0
	}
	if err != nil {
		s.t.Fatal(err)
	}
	var n int64
	for _, sh := range info.ShardInfo {
		n += sh.LastOffset
	}
	return n
}

// groupDone reports whether group has read and acked everything in the queue, and the queue holds
// want entries.
func (s *shop) groupDone(group string, want int64) (bool, string) {
	info, err := queue.Inspect(s.ctx, s.rd.Client(), queue.NewLayout("pgrelay"), s.queue)
	if err != nil {
		return false, err.Error()
	}
	var n int64
	for _, sh := range info.ShardInfo {
		n += sh.LastOffset
	}
	if n < want {
		return false, fmt.Sprintf("%d of %d entries in the queue", n, want)
	}
	for _, g := range info.Groups {
		if g.Name == group {
			return g.Lag == 0 && g.Pending == 0, fmt.Sprintf("group %s lag %d pending %d", group, g.Lag, g.Pending)
		}
	}
	return false, "no group " + group
}

// projectionLatency is the latency phase (see BenchmarkProjection).
func (s *shop) projectionLatency(b *testing.B, m *benchenv.Metrics, w *projWriters, db string, tps, seconds int) {
	ctx, cancel := context.WithCancel(s.ctx)
	defer cancel()
	model := s.readModel(db)
	if _, err := model.Exec(ctx, `
		CREATE FUNCTION bench_notify() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
			PERFORM pg_notify('order_docs', NEW.lsn::text || ' ' || (extract(epoch FROM NEW.ts) * 1000000)::bigint);
			RETURN NULL;
		END $$;
		CREATE TRIGGER bench_notify AFTER INSERT OR UPDATE ON order_docs FOR EACH ROW EXECUTE FUNCTION bench_notify();
		LISTEN order_docs;`); err != nil {
		b.Fatal(err)
	}
	start := s.queueEnd()
	p := s.startProjection(db, db, "input.redis_queue.start_from=latest")
	cdctest.WaitEvery(b, time.Minute, 5*time.Millisecond, "group "+db, func() (bool, string) { return s.groupDone(db, start) })

	var mu sync.Mutex
	docAt, queueAt, commitTS := map[string]time.Time{}, map[string]time.Time{}, map[string]time.Time{}
	var listening sync.WaitGroup
	listening.Add(2)
	go func() { // documents: one notification per document version, delivered at the sink's commit
		defer listening.Done()
		for {
			n, err := model.WaitForNotification(ctx)
			if err != nil {
				return
			}
			now := time.Now()
			lsn, us, _ := strings.Cut(n.Payload, " ")
			t, _ := strconv.ParseInt(us, 10, 64)
			mu.Lock()
			docAt[lsn], commitTS[lsn] = now, time.UnixMicro(t)
			mu.Unlock()
		}
	}()
	go func() { // the same transactions' events in the queue
		defer listening.Done()
		rdb := s.rd.Client()
		defer rdb.Close()
		follow.Queue(ctx, rdb, s.queue, func(payload string, now time.Time) {
			var ev struct{ LSN string }
			if json.Unmarshal([]byte(payload), &ev) == nil {
				mu.Lock()
				queueAt[ev.LSN] = now
				mu.Unlock()
			}
		})
	}()
	warm := int64(w.atRate(b, tps, time.Second))
	cdctest.WaitEvery(b, time.Minute, 5*time.Millisecond, "the warm-up's documents", func() (bool, string) { return s.groupDone(db, start+warm) })
	c0 := time.Now()
	changes := w.atRate(b, tps, time.Duration(seconds)*time.Second)
	want := start + warm + int64(changes)
	cdctest.WaitEvery(b, time.Minute, 5*time.Millisecond, "the projection to catch up", func() (bool, string) { return s.groupDone(db, want) })
	m.Add("lat_changes/s", float64(changes)/time.Since(c0).Seconds())
	time.Sleep(300 * time.Millisecond) // the last notifications and XREADs
	cancel()
	listening.Wait()
	p.Kill()
	var doc, q []time.Duration
	for lsn, at := range docAt {
		if commitTS[lsn].Before(c0) { // the warm-up's
			continue
		}
		doc = append(doc, at.Sub(commitTS[lsn]))
		if qa, ok := queueAt[lsn]; ok {
			q = append(q, qa.Sub(commitTS[lsn]))
		}
	}
	if len(doc) == 0 || len(doc) < changes/4 {
		b.Fatalf("%d document versions notified for %d changes", len(doc), changes)
	}
	b.Logf("latency: %d transactions' documents, %d of them seen in the queue", len(doc), len(q))
	if n := benchenv.Size("PGRELAY_BENCH_SLOWEST", 0, 0); n > 0 {
		logSlowest(b, n, c0, docAt, queueAt, commitTS)
	}
	for _, p := range []struct {
		name string
		q    float64
	}{{"p50", 0.50}, {"p95", 0.95}, {"p99", 0.99}} {
		m.Add("doc_"+p.name+"_ms", ms(percentile(doc, p.q)))
		if len(q) > 0 {
			m.Add("queue_"+p.name+"_ms", ms(percentile(q, p.q)))
		}
	}
}

func percentile(ds []time.Duration, q float64) time.Duration {
	sort.Slice(ds, func(i, j int) bool { return ds[i] < ds[j] })
	return ds[min(len(ds)-1, int(float64(len(ds))*q))]
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// projectionLive is the live phase (see BenchmarkProjection).
func (s *shop) projectionLive(b *testing.B, m *benchenv.Metrics, w *projWriters, db string, seconds, srcPid, pm, rpid int) {
	s.readModel(db)
	start := s.queueEnd()
	p := s.startProjection(db, db, "input.redis_queue.start_from=latest")
	cdctest.WaitEvery(b, time.Minute, 5*time.Millisecond, "group "+db, func() (bool, string) { return s.groupDone(db, start) })
	cpu := func(pid int, tree bool) time.Duration {
		read := benchenv.CPU
		if tree {
			read = benchenv.TreeCPU
		}
		d, err := read(pid)
		if err != nil {
			b.Fatal(err)
		}
		return d
	}
	src0, sink0, r0, pg0 := cpu(srcPid, false), cpu(p.Pid(), false), cpu(rpid, false), cpu(pm, true)
	t0 := time.Now()
	changes, took := w.flatOut(b, time.Duration(seconds)*time.Second)
	want := start + int64(changes)
	cdctest.WaitEvery(b, 5*time.Minute, 5*time.Millisecond, "the live projection to catch up", func() (bool, string) { return s.groupDone(db, want) })
	elapsed := time.Since(t0)
	m.Add("live_changes/s", float64(changes)/elapsed.Seconds())
	m.Add("writers_changes/s", float64(changes)/took.Seconds())
	m.Add("live_cpu_source_us/change", benchenv.PerChange(cpu(srcPid, false)-src0, changes))
	m.Add("live_cpu_projection_us/change", benchenv.PerChange(cpu(p.Pid(), false)-sink0, changes))
	m.Add("live_cpu_redis_us/change", benchenv.PerChange(cpu(rpid, false)-r0, changes))
	m.Add("live_cpu_postgres_us/change", benchenv.PerChange(cpu(pm, true)-pg0, changes))
	b.Logf("live: %d changes written in %s, all documents committed after %s", changes, took.Round(time.Millisecond), elapsed.Round(time.Millisecond))
	p.Kill()
}

// replaySink runs the projection over the whole queue into an empty read model; the window starts
// at its first applied entry (start-up excluded). It returns the rate.
func (s *shop) replaySink(b *testing.B, m *benchenv.Metrics, name string, pm int) float64 {
	model := s.readModel(name)
	total := s.queueEnd()
	p := s.startProjection(name, name)
	defer p.Kill()
	applied := func() int64 {
		var sum int64
		_ = model.QueryRow(s.ctx, `SELECT coalesce(sum(last_offset), 0) FROM pgrelay.sink_progress WHERE sink = $1`, name).Scan(&sum)
		return sum
	}
	var n0 int64
	cdctest.WaitEvery(b, 5*time.Minute, 2*time.Millisecond, name+" to start", func() (bool, string) { n0 = applied(); return n0 > 0, "" })
	s0, pg0, t0 := benchenv.Sample(p.Pid()), 0*time.Second, time.Now()
	if d, err := benchenv.TreeCPU(pm); err == nil {
		pg0 = d
	}
	cdctest.WaitEvery(b, 10*time.Minute, 5*time.Millisecond, name+" to apply the queue", func() (bool, string) {
		n := applied()
		return n >= total, fmt.Sprintf("%d of %d", n, total)
	})
	elapsed := time.Since(t0)
	self := s0.Stop()
	pg1, _ := benchenv.TreeCPU(pm)
	n := int(total - n0)
	rate := float64(n) / elapsed.Seconds()
	m.Add("replay_changes/s", rate)
	m.Add("replay_cpu_projection_us/change", benchenv.PerChange(self, n))
	m.Add("replay_cpu_postgres_us/change", benchenv.PerChange(pg1-pg0, n))
	return rate
}

// projectionStatements reads the projection's statements and params from its config, split as the
// sink runs them.
func projectionStatements(b *testing.B) (sqls []string, args [][]int, params []string) {
	raw, err := os.ReadFile(projectionConfig())
	if err != nil {
		b.Fatal(err)
	}
	var cfg struct {
		Output struct {
			PgSink struct {
				Statement string   `yaml:"statement"`
				Params    []string `yaml:"params"`
			} `yaml:"pg_sink"`
		} `yaml:"output"`
	}
	if err := yaml.Unmarshal(raw, &cfg); err != nil {
		b.Fatal(err)
	}
	sqls, args = sink.Statements(cfg.Output.PgSink.Statement)
	return sqls, args, cfg.Output.PgSink.Params
}

// replayLoop is the hand-written projector over the whole queue into an empty read model: the
// recipe's statements per entry, params taken from the event by hand. It returns the rate.
func (s *shop) replayLoop(b *testing.B, m *benchenv.Metrics, name string, pm int) float64 {
	sqls, args, params := projectionStatements(b)
	if strings.Join(params, " ") != "$ $.table $.key.id $.key.order_id $.lsn $.ts" {
		b.Fatalf("the hand-written projector reads params %v, the config has %v", "$ $.table $.key.id $.key.order_id $.lsn $.ts", params)
	}
	model := s.readModel(name)
	total := int(s.queueEnd())
	ctx := s.ctx
	rdb := s.rd.Client()
	defer rdb.Close()
	l := queue.NewLayout("pgrelay")
	var streams []string
	for sh := 0; sh < 16; sh++ {
		if err := rdb.XGroupCreateMkStream(ctx, l.Stream(s.queue, sh), name, "0").Err(); err != nil {
			b.Fatal(err)
		}
		streams = append(streams, l.Stream(s.queue, sh))
	}
	for range 16 {
		streams = append(streams, ">")
	}
	text := func(raw json.RawMessage) any {
		if len(raw) == 0 || string(raw) == "null" {
			return nil
		}
		var s string
		if raw[0] == '"' && json.Unmarshal(raw, &s) == nil {
			return s
		}
		return string(raw)
	}
	pg0, _ := benchenv.TreeCPU(pm)
	c0, t0 := benchenv.SelfCPU(), time.Now()
	for got := 0; got < total; {
		res, err := rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: name, Consumer: "c", Streams: streams, Count: 500, Block: time.Second}).Result()
		if err == redis.Nil {
			continue
		}
		if err != nil {
			b.Fatal(err)
		}
		for _, st := range res {
			if len(st.Messages) == 0 {
				continue
			}
			batch := &pgx.Batch{}
			acks := make([]string, len(st.Messages))
			var es []queue.Entry // the messages of the entries (a layout-3 entry holds several)
			for j, msg := range st.Messages {
				es = queue.EntriesOf(es, msg)
				acks[j] = msg.ID
			}
			for _, e := range es {
				payload := string(e.Payload)
				var ev struct {
					Table json.RawMessage `json:"table"`
					LSN   json.RawMessage `json:"lsn"`
					TS    json.RawMessage `json:"ts"`
					Key   struct {
						ID      json.RawMessage `json:"id"`
						OrderID json.RawMessage `json:"order_id"`
					} `json:"key"`
				}
				if err := json.Unmarshal([]byte(payload), &ev); err != nil {
					b.Fatal(err)
				}
				all := []any{payload, text(ev.Table), text(ev.Key.ID), text(ev.Key.OrderID), text(ev.LSN), text(ev.TS)}
				for k, q := range sqls {
					vals := make([]any, len(args[k]))
					for x, n := range args[k] {
						vals[x] = all[n]
					}
					batch.Queue(q, vals...)
				}
			}
			tx, err := model.Begin(ctx)
			if err != nil {
				b.Fatal(err)
			}
			if err := tx.SendBatch(ctx, batch).Close(); err != nil {
				b.Fatal(err)
			}
			if err := tx.Commit(ctx); err != nil {
				b.Fatal(err)
			}
			if err := rdb.XAck(ctx, st.Stream, name, acks...).Err(); err != nil {
				b.Fatal(err)
			}
			got += len(es)
		}
	}
	elapsed := time.Since(t0)
	self := benchenv.SelfCPU() - c0
	pg1, _ := benchenv.TreeCPU(pm)
	rate := float64(total) / elapsed.Seconds()
	m.Add("loop_changes/s", rate)
	m.Add("loop_cpu_client_us/change", benchenv.PerChange(self, total))
	m.Add("loop_cpu_postgres_us/change", benchenv.PerChange(pg1-pg0, total))
	// the hand-written projector must build the same documents, or its rate means nothing
	if want, got := s.docsOf(name), s.docsOf("replay"+strings.TrimPrefix(name, "loop")); want != got {
		b.Fatalf("the hand-written projector's documents (md5 %s) differ from the projection's (md5 %s)", want, got)
	}
	return rate
}

// docsOf is the md5 of database db's documents.
func (s *shop) docsOf(db string) string {
	var sum string
	if err := s.models[db].QueryRow(s.ctx, `SELECT md5(string_agg(t::text, E'\n' ORDER BY id)) FROM order_docs t`).Scan(&sum); err != nil {
		s.t.Fatal(err)
	}
	return sum
}
