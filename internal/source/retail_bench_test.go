package source

import (
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"

	"github.com/pgrelay/pgrelay/internal/convert"
	"github.com/pgrelay/pgrelay/internal/event"
	"github.com/pgrelay/pgrelay/internal/snapshot"
)

// BenchmarkEarlyChunkEvents: what an early chunk of 1,000 rows of the benchmarks' table
// (bench(id bigint, v text, n numeric, ts timestamptz)) costs to get its lsn: rendered again from
// its rows (render) or its rendered events' tails rewritten (retail). ns/op is per row.
func BenchmarkEarlyChunkEvents(b *testing.B) {
	reg := convert.NewRegistry()
	cols := []event.Column{{Name: "id", Type: reg.Lookup(20)}, {Name: "v", Type: reg.Lookup(25)},
		{Name: "n", Type: reg.Lookup(1700)}, {Name: "ts", Type: reg.Lookup(1184)}}
	tab := &snapTable{info: &TableInfo{Table: Table{Schema: "public", Name: "bench", Queue: "q"}}, full: "public.bench",
		enc: event.NewTable("public.bench", cols, []int{0}, []int{0})}
	ch := &snapshot.Chunk{ReadAt: time.Date(2026, 12, 6, 6, 0, 0, 0, time.UTC)}
	for i := range 1000 {
		ch.Rows.Append([][]byte{[]byte(fmt.Sprint(i)), []byte(fmt.Sprintf("value %d", i)),
			[]byte(fmt.Sprint(float64(i) * 1.5)), []byte("2026-12-06 06:00:00.123456+00")})
	}
	sn := &snapshotter{epoch: "e"}
	const hw = 0x16B3748
	p := &pendingChunk{table: tab, chunk: ch}
	events, _ := sn.render(p, hw)
	p.wentEarly, p.wentAt = true, 0x16B0001
	b.Run("render", func(b *testing.B) {
		for b.Loop() {
			sn.render(p, hw)
		}
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/1000, "ns/row")
	})
	b.Run("retail", func(b *testing.B) {
		from, to := pglogrepl.LSN(hw), p.wentAt
		for b.Loop() {
			sn.retail(p, events, from, to) // in place: back and forth between the two lsns
			from, to = to, from
		}
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/1000, "ns/row")
	})
}
