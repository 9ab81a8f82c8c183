package sink

import (
	"bytes"
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgrelay/pgrelay/internal/benchenv"
	"github.com/pgrelay/pgrelay/internal/testenv"
)

// benchRow is one 7-column row (bigint PK, text, int, int, float8, text, jsonb), as typed values for
// the hand-written baselines and as the JSON payload the sink reads.
type benchRow struct {
	id      int64
	name    string
	qty     int32
	version int32
	price   float64
	status  string
	attrs   string
	payload []byte
}

func benchRows(n int, round int) []benchRow {
	rows := make([]benchRow, n)
	for i := range rows {
		r := benchRow{id: int64(i + 1), name: fmt.Sprintf("item-%d-%d", i, round), qty: int32(i % 1000), version: int32(round),
			price: float64(i%10000) / 7, status: []string{"new", "paid", "sent"}[i%3], attrs: fmt.Sprintf(`{"color": "c%d", "size": %d}`, i%17, i%5)}
		r.payload = fmt.Appendf(nil, `{"id":%d,"name":%q,"qty":%d,"version":%d,"price":%v,"status":%q,"attrs":%s}`,
			r.id, r.name, r.qty, r.version, r.price, r.status, r.attrs)
		rows[i] = r
	}
	return rows
}

const benchDDL = `CREATE TABLE %s (id bigint PRIMARY KEY, name text, qty int, version int, price float8, status text, attrs jsonb)`

// benchFixture is a server, its pool and a table name generator for benchmarks.
type benchFixture struct {
	pool     *pgxpool.Pool
	server   *benchenv.Tree // the postmaster's tree, for the server's CPU time
	segments int
	n        int
}

func newBench(b *testing.B) *benchFixture {
	pg := testenv.StartPostgres(b, testenv.WithPGSetting("autovacuum = off"))
	pm, err := benchenv.PostmasterPid(pg.DataDir)
	if err != nil {
		b.Fatal(err)
	}
	return &benchFixture{pool: pg.Pool(), server: benchenv.NewTree(pm)}
}

// cost accumulates the wall time and the CPU time of this process (the sink, or the
// hand-written baseline) and of the PostgreSQL server over measured segments.
type cost struct {
	wall, self, server time.Duration
}

// measure runs fn as one segment of c. The server's processes are listed again for the first
// segments (the pool opens its connections) and every 16th after; reading them costs a few stat
// files per segment.
func (f *benchFixture) measure(b *testing.B, c *cost, fn func()) {
	if f.segments++; f.segments <= 4 || f.segments%16 == 0 {
		f.server.Refresh()
	}
	s0, err := f.server.CPU()
	if err != nil {
		b.Fatal(err)
	}
	c0, t0 := benchenv.SelfCPU(), time.Now()
	fn()
	c.wall += time.Since(t0)
	c.self += benchenv.SelfCPU() - c0
	s1, _ := f.server.CPU()
	c.server += s1 - s0
}

// report reports the rates, the ratio (baseline time ÷ sink time) and the CPU per row of each.
func (c cost) report(b *testing.B, base cost, baseName string, rows float64) {
	b.ReportMetric(rows/c.wall.Seconds(), "sink_rows/s")
	b.ReportMetric(rows/base.wall.Seconds(), baseName+"_rows/s")
	b.ReportMetric(base.wall.Seconds()/c.wall.Seconds(), "ratio")
	b.ReportMetric(float64(c.self.Microseconds())/rows, "sink_cpu_pgrelay_us/row")
	b.ReportMetric(float64(c.server.Microseconds())/rows, "sink_cpu_postgres_us/row")
	b.ReportMetric(float64(base.self.Microseconds())/rows, baseName+"_cpu_client_us/row")
	b.ReportMetric(float64(base.server.Microseconds())/rows, baseName+"_cpu_postgres_us/row")
}

func (f *benchFixture) table(b *testing.B) string {
	f.n++
	name := fmt.Sprintf("bench_%d", f.n)
	if _, err := f.pool.Exec(context.Background(), fmt.Sprintf(benchDDL, name)); err != nil {
		b.Fatal(err)
	}
	return name
}

// sinkPass writes rows through the Applier in batches; offsets continue from *off.
func sinkPass(b *testing.B, a *Applier, rows []benchRow, batch int, off *int64) {
	ctx := context.Background()
	for i := 0; i < len(rows); i += batch {
		msgs := make([]*Message, 0, batch)
		for _, r := range rows[i:min(i+batch, len(rows))] {
			*off++
			msgs = append(msgs, &Message{Queue: "bench", Shard: int32(*off % 4), Offset: *off, HasPosition: true, Payload: r.payload})
		}
		res, err := a.Write(ctx, msgs)
		if err != nil || res.Applied != len(msgs) {
			b.Fatalf("write: %v %+v", err, res)
		}
	}
}

// unnestPass is the hand-written baseline: typed arrays, INSERT ... SELECT FROM unnest ... ON CONFLICT,
// one transaction per batch.
func unnestPass(b *testing.B, pool *pgxpool.Pool, table string, rows []benchRow, batch int) {
	ctx := context.Background()
	sql := `INSERT INTO ` + table + ` (id, name, qty, version, price, status, attrs)
		SELECT * FROM unnest($1::bigint[], $2::text[], $3::int[], $4::int[], $5::float8[], $6::text[], $7::jsonb[])
		ON CONFLICT (id) DO UPDATE SET name = EXCLUDED.name, qty = EXCLUDED.qty, version = EXCLUDED.version,
		price = EXCLUDED.price, status = EXCLUDED.status, attrs = EXCLUDED.attrs`
	for i := 0; i < len(rows); i += batch {
		part := rows[i:min(i+batch, len(rows))]
		ids, names, qtys, vers, prices, stats, attrs := make([]int64, len(part)), make([]string, len(part)), make([]int32, len(part)),
			make([]int32, len(part)), make([]float64, len(part)), make([]string, len(part)), make([]string, len(part))
		for j, r := range part {
			ids[j], names[j], qtys[j], vers[j], prices[j], stats[j], attrs[j] = r.id, r.name, r.qty, r.version, r.price, r.status, r.attrs
		}
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			_, err := tx.Exec(ctx, sql, ids, names, qtys, vers, prices, stats, attrs)
			return err
		})
		if err != nil {
			b.Fatal(err)
		}
	}
}

// copyPass is the append baseline: COPY of typed rows, one transaction per batch.
func copyPass(b *testing.B, pool *pgxpool.Pool, table string, rows []benchRow, batch int) {
	ctx := context.Background()
	cols := []string{"id", "name", "qty", "version", "price", "status", "attrs"}
	for i := 0; i < len(rows); i += batch {
		part := rows[i:min(i+batch, len(rows))]
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			_, err := tx.CopyFrom(ctx, pgx.Identifier{table}, cols, pgx.CopyFromSlice(len(part), func(j int) ([]any, error) {
				r := part[j]
				return []any{r.id, r.name, r.qty, r.version, r.price, r.status, r.attrs}, nil
			}))
			return err
		})
		if err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkUpsert compares the sink's upsert mode (JSON payloads, progress rows, exactly-once) with
// the hand-written unnest + ON CONFLICT loop over the same rows, in the same run: an insert pass and
// an update pass of `rows` rows each. Reported: rows/s of both and their ratio (goal >= 0.7).
func BenchmarkUpsert(b *testing.B) {
	f := newBench(b)
	n := benchenv.Size("PGRELAY_BENCH_SINK_ROWS", 20000, 4000)
	for _, batch := range []int{500, 2000} {
		b.Run(fmt.Sprintf("batch=%d", batch), func(b *testing.B) {
			insert, update := benchRows(n, 1), benchRows(n, 2)
			var sink, base cost
			for i := 0; i < b.N; i++ {
				tSink, tBase := f.table(b), f.table(b)
				a, err := NewApplier(context.Background(), f.pool, Config{Name: tSink, Table: tSink, Mode: ModeUpsert,
					ProgressTable: DefaultProgressTable, CreateProgressTable: true, RequireProgress: true}, nil)
				if err != nil {
					b.Fatal(err)
				}
				var off int64
				// interleaved batch by batch, so load changes on the machine hit both alike
				for _, pass := range [][]benchRow{insert, update} {
					for j := 0; j < len(pass); j += batch {
						chunk := pass[j:min(j+batch, len(pass))]
						f.measure(b, &base, func() { unnestPass(b, f.pool, tBase, chunk, batch) })
						f.measure(b, &sink, func() { sinkPass(b, a, chunk, batch, &off) })
					}
				}
			}
			sink.report(b, base, "unnest", float64(2*n*b.N))
		})
	}
}

// BenchmarkCDC is BenchmarkUpsert for mode cdc: the same rows as pg_cdc's change events (`c` for
// the insert pass, `u` for the update pass) against the same unnest + ON CONFLICT loop, in the same
// run. Reported as BenchmarkUpsert.
func BenchmarkCDC(b *testing.B) {
	f := newBench(b)
	n := benchenv.Size("PGRELAY_BENCH_SINK_ROWS", 20000, 4000)
	events := func(rows []benchRow, op string) []benchRow {
		out := make([]benchRow, len(rows))
		for i, r := range rows {
			out[i] = r
			out[i].payload = fmt.Appendf(nil, `{"op":%q,"table":"public.bench","key":{"id":%d},"after":%s,"before":null,"lsn":"0/16B3748","xid":771,"ts":"2026-10-03T06:15:03.583036Z","seq":%d}`,
				op, r.id, r.payload, i)
		}
		return out
	}
	const batch = 500
	insert, update := benchRows(n, 1), benchRows(n, 2)
	evInsert, evUpdate := events(insert, "c"), events(update, "u")
	var sink, base cost
	for i := 0; i < b.N; i++ {
		tSink, tBase := f.table(b), f.table(b)
		a, err := NewApplier(context.Background(), f.pool, Config{Name: tSink, Table: tSink, Mode: ModeCDC,
			ProgressTable: DefaultProgressTable, CreateProgressTable: true, RequireProgress: true}, nil)
		if err != nil {
			b.Fatal(err)
		}
		var off int64
		for k, pass := range [][]benchRow{insert, update} {
			evs := [][]benchRow{evInsert, evUpdate}[k]
			for j := 0; j < len(pass); j += batch {
				f.measure(b, &base, func() { unnestPass(b, f.pool, tBase, pass[j:min(j+batch, len(pass))], batch) })
				f.measure(b, &sink, func() { sinkPass(b, a, evs[j:min(j+batch, len(evs))], batch, &off) })
			}
		}
	}
	sink.report(b, base, "unnest", float64(2*n*b.N))
}

// BenchmarkAppend compares the sink's append mode with COPY of the same rows, one transaction per
// batch each. Reported: rows/s of both and their ratio (goal >= 0.5).
func BenchmarkAppend(b *testing.B) {
	f := newBench(b)
	n := benchenv.Size("PGRELAY_BENCH_SINK_ROWS", 20000, 4000)
	for _, batch := range []int{500, 2000} {
		b.Run(fmt.Sprintf("batch=%d", batch), func(b *testing.B) {
			rows := benchRows(n, 1)
			var sink, base cost
			for i := 0; i < b.N; i++ {
				tSink, tBase := f.table(b), f.table(b)
				a, err := NewApplier(context.Background(), f.pool, Config{Name: tSink, Table: tSink, Mode: ModeAppend,
					ProgressTable: DefaultProgressTable, CreateProgressTable: true, RequireProgress: true}, nil)
				if err != nil {
					b.Fatal(err)
				}
				var off int64
				for j := 0; j < len(rows); j += batch {
					chunk := rows[j:min(j+batch, len(rows))]
					f.measure(b, &base, func() { copyPass(b, f.pool, tBase, chunk, batch) })
					f.measure(b, &sink, func() { sinkPass(b, a, chunk, batch, &off) })
				}
			}
			sink.report(b, base, "copy", float64(n*b.N))
		})
	}
}

// benchTarget is benchDDL's table as Inspect reads it, for benchmarks without a server.
func benchTarget() *Target {
	cols := []Column{
		{Name: "id", Num: 1, CastType: "bigint", BaseType: pgtype.Int8OID, Kind: kindText},
		{Name: "name", Num: 2, CastType: "text", BaseType: pgtype.TextOID, Kind: kindText},
		{Name: "qty", Num: 3, CastType: "integer", BaseType: pgtype.Int4OID, Kind: kindText},
		{Name: "version", Num: 4, CastType: "integer", BaseType: pgtype.Int4OID, Kind: kindText},
		{Name: "price", Num: 5, CastType: "double precision", BaseType: pgtype.Float8OID, Kind: kindText},
		{Name: "status", Num: 6, CastType: "text", BaseType: pgtype.TextOID, Kind: kindText},
		{Name: "attrs", Num: 7, CastType: "jsonb", BaseType: pgtype.JSONBOID, Kind: kindJSON},
	}
	t := &Target{Schema: "public", Name: "bench", Columns: cols, byName: map[string]int{}, Key: []string{"id"}}
	for i, c := range cols {
		t.byName[c.Name] = i
	}
	return t
}

// BenchmarkGoSide is the sink's own work for a 500-row batch without a server: decoding the
// payloads, planning the statements and encoding their parameters as pgx sends them. Reported: the
// process's CPU time per row (garbage collection included, unlike ns/op) and allocations, so
// changes to the Go side can be measured on a busy machine.
func BenchmarkGoSide(b *testing.B) {
	rows := benchRows(500, 1)
	msgs := make([]*Message, len(rows))
	for i, r := range rows {
		msgs[i] = &Message{Queue: "bench", Shard: int32(i % 4), Offset: int64(i + 1), HasPosition: true, Payload: r.payload}
	}
	for _, mode := range []Mode{ModeUpsert, ModeAppend} {
		b.Run(string(mode), func(b *testing.B) {
			cfg := Config{Mode: mode, Table: "bench", UnknownKeys: UnknownKeysWarn} // the default watch of unknown keys, as the plugin runs
			h, err := newModeHandler(&cfg, benchTarget(), newUnknownKeys(&cfg, cfg.Table))
			if err != nil {
				b.Fatal(err)
			}
			var out []byte
			b.ReportAllocs()
			b.ResetTimer()
			cpu0 := benchenv.SelfCPU()
			pending := make([]int, len(msgs))
			for j := range pending {
				pending[j] = j
			}
			for i := 0; i < b.N; i++ {
				if am, ok := h.(appendMode); ok { // the streamed COPY: decoded and encoded in its reader
					s, ok := am.w.newCopyStream(msgs, pending)
					if !ok {
						b.Fatal("no copy stream")
					}
					out = out[:0]
					for {
						n, err := s.Read(out[len(out):cap(out)])
						out = out[:len(out)+n]
						if err != nil {
							break
						}
						if len(out) == cap(out) {
							out = append(out, 0)[:len(out)]
						}
					}
					if !s.done || s.stopped.Load() {
						b.Fatal("stream stopped")
					}
					continue
				}
				ops := make([]op, len(msgs))
				buf := newRowBuf(msgs)
				for j, m := range msgs {
					if ops[j], err = h.decode(m, buf); err != nil {
						b.Fatal(err)
					}
				}
				stmts, err := h.plan(ops)
				if err != nil {
					b.Fatal(err)
				}
				for _, s := range stmts {
					out = make([]byte, 0, 256) // pgx starts every statement's parameters in a fresh 256-byte buffer
					for _, a := range s.args {
						if out, err = (textArrayPlan{}).Encode(a, out); err != nil {
							b.Fatal(err)
						}
					}
				}
			}
			b.ReportMetric(float64((benchenv.SelfCPU()-cpu0).Nanoseconds())/float64(b.N*len(msgs)), "cpu_ns/row")
		})
	}
}

// BenchmarkCDCGoSide is BenchmarkGoSide for mode cdc: a 500-event batch of `u` events decoded,
// planned and encoded, by a sink of one table (`table`) and by one with `tables` whose events of
// two tables go to two targets (the same shape), so the routed mode's cost per event reads as a
// ratio to the one-table sink's in the same run. Reported: CPU time per event and allocations.
func BenchmarkCDCGoSide(b *testing.B) {
	rows := benchRows(500, 1)
	msgs := make([]*Message, len(rows))
	for i, r := range rows {
		table := []string{"public.bench", "public.bench2"}[i%2]
		payload := fmt.Appendf(nil, `{"op":"u","table":%q,"key":{"id":%d},"after":%s,"before":null,"lsn":"0/16B3748","xid":771,"ts":"2026-10-03T06:15:03.583036Z","seq":%d}`,
			table, r.id, r.payload, i)
		msgs[i] = &Message{Queue: "bench", Shard: int32(i % 4), Offset: int64(i + 1), HasPosition: true, Payload: payload}
	}
	cfg := Config{Mode: ModeCDC, Table: "bench", UnknownKeys: UnknownKeysWarn}
	h, err := newModeHandler(&cfg, benchTarget(), newUnknownKeys(&cfg, cfg.Table))
	if err != nil {
		b.Fatal(err)
	}
	single := h.(cdcMode)
	single.tables = newTableWatch(func(_, _ string) {}) // as the plugin runs it: the event tables followed
	routes := mustRoutes(b, map[string]string{"public.*": "public.*"})
	t2 := benchTarget()
	t2.Name, t2.OID = "bench2", 2
	routed := &routedMode{routes: routes, targets: map[string]*routed{
		"public.bench":  {t: benchTarget(), mode: cdcMode{w: newWriter(benchTarget(), cfg.Metadata).watching(newUnknownKeys(&cfg, "public.bench"))}},
		"public.bench2": {t: t2, mode: cdcMode{w: newWriter(t2, cfg.Metadata).watching(newUnknownKeys(&cfg, "public.bench2"))}},
	}}
	// the same events in envelopes of 50 (pg_cdc's envelopes: one message per transaction)
	var envelopes []*Message
	for i := 0; i < len(msgs); i += 50 {
		var events [][]byte
		for _, m := range msgs[i:min(i+50, len(msgs))] {
			events = append(events, m.Payload)
		}
		payload := fmt.Appendf(nil, `{"op":"x","id":"pg:0a1b2c3d:%016X","lsn":"0/16B3748","xid":771,"ts":"2026-10-03T06:15:03.583036Z","part":1,"last":true,"events":[%s]}`,
			i, bytes.Join(events, []byte(",")))
		envelopes = append(envelopes, &Message{Queue: "bench", Shard: 0, Offset: int64(len(envelopes) + 1), HasPosition: true, Payload: payload})
	}
	for _, c := range []struct {
		name string
		h    modeHandler
		msgs []*Message
	}{{"table", single, msgs}, {"tables", routed, msgs}, {"tables_envelopes", routed, envelopes}} {
		b.Run(c.name, func(b *testing.B) {
			msgs := c.msgs
			b.ReportAllocs()
			b.ResetTimer()
			cpu0 := benchenv.SelfCPU()
			a, ctx := &Applier{}, context.Background()
			for i := 0; i < b.N; i++ {
				ops := make([]op, len(msgs))
				buf := newRowBuf(msgs)
				h := c.h
				for j, m := range msgs {
					var decodeErr error
					if ops[j], decodeErr, err = a.decodeResolving(ctx, &h, m, buf); err != nil || decodeErr != nil {
						b.Fatal(err, decodeErr)
					}
				}
				stmts, err := h.plan(ops)
				if err != nil {
					b.Fatal(err)
				}
				for _, s := range stmts {
					out := make([]byte, 0, 256)
					for _, a := range s.args {
						if out, err = (textArrayPlan{}).Encode(a, out); err != nil {
							b.Fatal(err)
						}
					}
				}
			}
			b.ReportMetric(float64((benchenv.SelfCPU()-cpu0).Nanoseconds())/float64(b.N*len(rows)), "cpu_ns/event")
		})
	}
}
