package source_test

import (
	"context"
	"encoding/json"
	"fmt"
	"hash/crc32"
	"os"
	"sort"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/redis/go-redis/v9"

	"github.com/pgrelay/pgrelay/internal/pointer"
	"github.com/pgrelay/pgrelay/internal/testenv"
)

// benchChanges is the number of changes per benchmark (PGRELAY_BENCH_CHANGES, default 100,000;
// the issue asks for 1M, scaled down for a 2-core machine shared with other work).
func benchChanges() int {
	if n, err := strconv.Atoi(os.Getenv("PGRELAY_BENCH_CHANGES")); err == nil && n > 0 {
		return n
	}
	return 100000
}

func BenchmarkSourceTx1(b *testing.B)    { benchSource(b, 1) }
func BenchmarkSourceTx10(b *testing.B)   { benchSource(b, 10) }
func BenchmarkSourceTx1000(b *testing.B) { benchSource(b, 1000) }

// benchSource writes benchChanges() rows in transactions of txRows, then measures in the same
// run (1) the raw decode ceiling: a plain pgoutput slot drained to nowhere, (2) pg_cdc catching
// up into redis_queue from its own slot, (3) pg_cdc into drop, and (4) the Redis ceiling under
// the same Redis settings: the entries pg_cdc wrote, XADDed again with plain pipelines of 1,000
// (no script, no fence, no pointer). It reports the rates and the ratios to the decode ceiling.
func benchSource(b *testing.B, txRows int) {
	total := benchChanges()
	e := &env{t: b, pg: testenv.StartPostgres(b), rd: testenv.StartRedis(b, redisArgs()...), ctx: context.Background()}
	e.pg.Exec(`CREATE TABLE bench (id bigint PRIMARY KEY, v text, n numeric, ts timestamptz)`)
	e.pg.Exec(`CREATE PUBLICATION raw FOR TABLE bench`)
	e.pg.Exec(`SELECT pg_create_logical_replication_slot('raw', 'pgoutput')`)
	for _, name := range []string{"bench", "benchdrop"} {
		stop := runBench(b, e, name)
		waitBenchPointer(b, e, name)
		stop()
	}
	var endLSN pglogrepl.LSN
	for i := 0; i < total; i += txRows {
		if i+txRows >= total { // any commit at or past endLSN is the last transaction's
			var end string
			if err := e.pg.Pool().QueryRow(e.ctx, `SELECT pg_current_wal_lsn()::text`).Scan(&end); err != nil {
				b.Fatal(err)
			}
			endLSN, _ = pglogrepl.ParseLSN(end)
		}
		e.pg.Exec(`INSERT INTO bench SELECT g, 'value ' || g, g * 1.5, now() FROM generate_series($1::bigint, $2::bigint) g`, i, i+txRows-1)
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		start := time.Now()
		rawDrain(b, e, endLSN)
		raw := time.Since(start)
		cdc := catchUp(b, e, "bench", endLSN)
		drop := catchUp(b, e, "benchdrop", endLSN)
		xadd := rawXAdd(b, e, "q")
		rawRate, cdcRate, dropRate := float64(total)/raw.Seconds(), float64(total)/cdc.Seconds(), float64(total)/drop.Seconds()
		xaddRate := float64(total) / xadd.Seconds()
		b.ReportMetric(xaddRate, "xadd_changes/s")
		b.ReportMetric(xaddRate/rawRate, "xadd_ratio")
		b.ReportMetric(rawRate, "raw_changes/s")
		b.ReportMetric(cdcRate, "queue_changes/s")
		b.ReportMetric(cdcRate/rawRate, "queue_ratio")
		b.ReportMetric(dropRate, "drop_changes/s")
		b.ReportMetric(dropRate/rawRate, "drop_ratio")
	}
}

// rawXAdd reads back every entry pg_cdc wrote to queue q and times writing them again, same
// fields and bytes, to other keys with pipelines of 1,000 plain XADDs: what the Redis server
// itself costs under this run's settings.
func rawXAdd(b *testing.B, e *env, q string) time.Duration {
	rdb := e.rd.Client()
	var entries []redis.XMessage
	var keys []string
	for n := 0; n < 16; n++ {
		key := "pgrelay:{" + q + "}:s:" + strconv.Itoa(n)
		msgs, err := rdb.XRange(e.ctx, key, "-", "+").Result()
		if err != nil {
			b.Fatal(err)
		}
		for range msgs {
			keys = append(keys, "xadd:{x}:s:"+strconv.Itoa(n))
		}
		entries = append(entries, msgs...)
	}
	fields := []string{"off", "p", "id", "tx", "ts", "h", "d"}
	start := time.Now()
	for i := 0; i < len(entries); i += 1000 {
		_, err := rdb.Pipelined(e.ctx, func(p redis.Pipeliner) error {
			for j := i; j < min(i+1000, len(entries)); j++ {
				vals := make([]any, 0, 14)
				for _, f := range fields {
					vals = append(vals, f, entries[j].Values[f])
				}
				p.XAdd(e.ctx, &redis.XAddArgs{Stream: keys[j], Values: vals})
			}
			return nil
		})
		if err != nil {
			b.Fatal(err)
		}
	}
	return time.Since(start)
}

// catchUp runs pg_cdc name from its pointer until it covers endLSN and returns how long it took.
func catchUp(b *testing.B, e *env, name string, endLSN pglogrepl.LSN) time.Duration {
	start := time.Now()
	stop := runBench(b, e, name)
	defer stop()
	for {
		raw, err := e.rd.Client().Get(e.ctx, "pgrelay:{q}:src:"+name+":ptr").Bytes()
		if err == nil {
			if p, err := pointer.Parse(raw); err == nil && p.InTxn == nil && p.LSNValue() >= endLSN {
				return time.Since(start)
			}
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// runBench runs pg_cdc into redis_queue ("bench") or into drop ("benchdrop": the source alone,
// with the pointer written by pg_cdc after each ack).
func runBench(b *testing.B, e *env, name string) func() {
	output := fmt.Sprintf("redis_queue:\n    url: %s\n    durability: %s", e.rd.URL(), benchDurability())
	if name == "benchdrop" {
		output = "drop: {}"
	}
	yaml := fmt.Sprintf(`
input:
  pg_cdc:
    name: %s
    dsn: %s
    tls: {mode: disable}
    tables: [{table: bench, queue: q}]
    redis: {url: %s}
output:
  %s
logger:
  level: warn
`, name, e.pg.DSN(), e.rd.URL(), output)
	return startStream(b, yaml)
}

func waitBenchPointer(b *testing.B, e *env, name string) {
	for e.rd.Client().Exists(e.ctx, "pgrelay:{q}:src:"+name+":ptr").Val() == 0 {
		time.Sleep(20 * time.Millisecond)
	}
}

// rawDrain reads slot raw until a commit at or past end, decoding every message and dropping it.
func rawDrain(b *testing.B, e *env, end pglogrepl.LSN) {
	cfg, _ := pgconn.ParseConfig(e.pg.DSN() + "&replication=database")
	conn, err := pgconn.ConnectConfig(e.ctx, cfg)
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close(e.ctx)
	if err := pglogrepl.StartReplication(e.ctx, conn, "raw", 0, pglogrepl.StartReplicationOptions{
		PluginArgs: []string{"proto_version '1'", "publication_names 'raw'", "messages 'true'"}}); err != nil {
		b.Fatal(err)
	}
	for {
		msg, err := conn.ReceiveMessage(e.ctx)
		if err != nil {
			b.Fatal(err)
		}
		cd, ok := msg.(*pgproto3.CopyData)
		if !ok || len(cd.Data) == 0 || cd.Data[0] != pglogrepl.XLogDataByteID {
			continue
		}
		data := cd.Data
		x, err := pglogrepl.ParseXLogData(data[1:])
		if err != nil {
			b.Fatal(err)
		}
		m, err := pglogrepl.Parse(x.WALData)
		if err != nil {
			b.Fatal(err)
		}
		if c, ok := m.(*pglogrepl.CommitMessage); ok && c.CommitLSN >= end {
			return
		}
	}
}

// BenchmarkSourceLatency writes single-row transactions at a steady PGRELAY_BENCH_TPS (default
// 2,000/s) for 5 s and reports commit→queue latency percentiles: from the event's commit time
// (`ts`, PostgreSQL's clock) to the moment a blocking XREAD returned it (same host clock). The
// baseline, measured at the same time on the same transactions: commit time → the commit message
// decoded by pglogrepl from a plain pgoutput slot (raw_p50_ms, raw_p99_ms), what PostgreSQL and
// the host cost before any connector does anything.
func BenchmarkSourceLatency(b *testing.B) {
	tps := 2000
	if n, err := strconv.Atoi(os.Getenv("PGRELAY_BENCH_TPS")); err == nil && n > 0 {
		tps = n
	}
	e := &env{t: b, pg: testenv.StartPostgres(b), rd: testenv.StartRedis(b, redisArgs()...), ctx: context.Background()}
	e.pg.Exec(`CREATE TABLE lat (id bigint PRIMARY KEY, v text)`)
	e.pg.Exec(`CREATE PUBLICATION rawlat FOR TABLE lat`)
	e.pg.Exec(`SELECT pg_create_logical_replication_slot('rawlat', 'pgoutput')`)
	startStream(b, fmt.Sprintf(`
input:
  pg_cdc:
    name: lat
    dsn: %s
    tls: {mode: disable}
    tables: [{table: lat, queue: q, partition_by: single}]
    redis: {url: %s}
output:
  redis_queue:
    url: %s
    durability: %s
logger:
  level: warn
`, e.pg.DSN(), e.rd.URL(), e.rd.URL(), durability()))
	waitBenchPointer(b, e, "lat")
	e.pg.Exec(`INSERT INTO lat VALUES (0, 'warm-up')`)
	stream := "pgrelay:{q}:s:" + strconv.Itoa(int(crc32.ChecksumIEEE([]byte("all"))%16))
	for e.rd.Client().XLen(e.ctx, stream).Val() == 0 {
		time.Sleep(10 * time.Millisecond)
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		total := tps * 5
		lat := make([]time.Duration, 0, total)
		// read from the last entry before the writers start ("$" would miss entries written
		// before the first XREAD is issued, and then wait for them forever)
		last := "0"
		if tail, err := e.rd.Client().XRevRangeN(e.ctx, stream, "+", "-", 1).Result(); err == nil && len(tail) == 1 {
			last = tail[0].ID
		}
		done := make(chan struct{})
		rawDone := make(chan []time.Duration, 1)
		go func() { rawDone <- rawCommitLatency(b, e, "rawlat", total) }()
		reader := e.rd.Client() // one connection: Client() dials a new one per call
		go func() {
			defer close(done)
			for len(lat) < total {
				res, err := reader.XRead(e.ctx, &redis.XReadArgs{Streams: []string{stream, last}, Block: 10 * time.Second, Count: 1000}).Result()
				if err != nil {
					b.Error(err)
					return
				}
				now := time.Now()
				for _, m := range res[0].Messages {
					last = m.ID
					var ev struct{ TS string }
					json.Unmarshal([]byte(fmt.Sprint(m.Values["d"])), &ev)
					ts, _ := time.Parse("2006-01-02T15:04:05.000000Z", ev.TS)
					lat = append(lat, now.Sub(ts))
				}
			}
		}()
		writeAtRate(b, e, tps, total, int64(i+1)*10_000_000)
		<-done
		sort.Slice(lat, func(a, c int) bool { return lat[a] < lat[c] })
		if len(lat) == 0 {
			b.Fatal("no events")
		}
		b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1000, "p50_ms")
		b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds())/1000, "p99_ms")
		if raw := <-rawDone; len(raw) > 0 {
			sort.Slice(raw, func(a, c int) bool { return raw[a] < raw[c] })
			b.ReportMetric(float64(raw[len(raw)/2].Microseconds())/1000, "raw_p50_ms")
			b.ReportMetric(float64(raw[len(raw)*99/100].Microseconds())/1000, "raw_p99_ms")
		}
	}
}

// redisArgs are extra redis-server arguments for the throughput benchmarks: PGRELAY_BENCH_FSYNC
// (default always, as every test Redis: appendonly yes, appendfsync always; e.g. "everysec").
func redisArgs() []string {
	if f := os.Getenv("PGRELAY_BENCH_FSYNC"); f != "" {
		return []string{"--appendfsync", f}
	}
	return nil
}

// benchDurability is the throughput benchmarks' redis_queue durability: aof (what exactly-once
// needs) when Redis fsyncs every write, else none (aof would refuse such a server).
func benchDurability() string {
	if f := os.Getenv("PGRELAY_BENCH_FSYNC"); f != "" && f != "always" {
		return "none"
	}
	return "aof"
}

// durability is the redis_queue durability of the latency benchmark (PGRELAY_BENCH_DURABILITY,
// default aof: every acknowledged write fsynced by Redis).
func durability() string {
	if d := os.Getenv("PGRELAY_BENCH_DURABILITY"); d != "" {
		return d
	}
	return "aof"
}

// rawCommitLatency drains slot from where it stands and returns, for the next n transactions that
// wrote rows, the time from each commit's timestamp to its commit message being decoded here.
func rawCommitLatency(b *testing.B, e *env, slot string, n int) []time.Duration {
	cfg, _ := pgconn.ParseConfig(e.pg.DSN() + "&replication=database")
	conn, err := pgconn.ConnectConfig(e.ctx, cfg)
	if err != nil {
		b.Error(err)
		return nil
	}
	defer conn.Close(e.ctx)
	if err := pglogrepl.StartReplication(e.ctx, conn, slot, 0, pglogrepl.StartReplicationOptions{
		PluginArgs: []string{"proto_version '1'", "publication_names '" + slot + "'"}}); err != nil {
		b.Error(err)
		return nil
	}
	out := make([]time.Duration, 0, n)
	rows := false
	var flushed pglogrepl.LSN
	for len(out) < n {
		ctx, cancel := context.WithTimeout(e.ctx, 30*time.Second)
		msg, err := conn.ReceiveMessage(ctx)
		cancel()
		if err != nil {
			b.Error(err)
			return out
		}
		cd, ok := msg.(*pgproto3.CopyData)
		if !ok || len(cd.Data) == 0 {
			continue
		}
		switch cd.Data[0] {
		case pglogrepl.PrimaryKeepaliveMessageByteID:
			if ka, err := pglogrepl.ParsePrimaryKeepaliveMessage(cd.Data[1:]); err == nil && ka.ReplyRequested {
				pglogrepl.SendStandbyStatusUpdate(e.ctx, conn, pglogrepl.StandbyStatusUpdate{WALWritePosition: flushed})
			}
			continue
		case pglogrepl.XLogDataByteID:
		default:
			continue
		}
		x, err := pglogrepl.ParseXLogData(cd.Data[1:])
		if err != nil {
			b.Error(err)
			return out
		}
		m, err := pglogrepl.Parse(x.WALData)
		if err != nil {
			b.Error(err)
			return out
		}
		switch m := m.(type) {
		case *pglogrepl.InsertMessage:
			rows = true
		case *pglogrepl.CommitMessage:
			now := time.Now()
			if rows {
				out = append(out, now.Sub(m.CommitTime))
			}
			rows, flushed = false, m.CommitLSN
		}
	}
	return out
}

// writeAtRate inserts total single-row transactions at tps from 4 connections, ids from base.
func writeAtRate(b *testing.B, e *env, tps, total int, base int64) {
	const writers = 4
	var wg sync.WaitGroup
	for w := 0; w < writers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			interval := time.Second * writers / time.Duration(tps)
			next := time.Now()
			for n := w; n < total; n += writers {
				time.Sleep(time.Until(next))
				next = next.Add(interval)
				if _, err := e.pg.Pool().Exec(e.ctx, `INSERT INTO lat VALUES ($1, 'x')`, base+int64(n)); err != nil {
					b.Error(err)
					return
				}
			}
		}(w)
	}
	wg.Wait()
}
